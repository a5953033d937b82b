"""Loads the compiled extension and registers its FFI targets with XLA."""
from __future__ import annotations

import functools
import warnings

import jax

GEMM_TARGET = "jax_cluster_gemm"
GEMM_EPILOGUE_TARGET = "jax_cluster_gemm_epilogue"
RAGGED_TARGET = "jax_cluster_ragged_dot"

try:
    from jax_cluster import _ext
    _IMPORT_ERROR: Exception | None = None
except ImportError as exc:  # a source checkout that was never built
    _ext = None
    _IMPORT_ERROR = exc


def extension():
    """The nanobind module, or None when it is missing."""
    return _ext


def with_kernels() -> bool:
    return _ext is not None and bool(_ext.with_cuda)


def why_no_kernels() -> str:
    if _ext is None:
        return f"the compiled extension is missing ({_IMPORT_ERROR})"
    if not _ext.with_cuda:
        return "the package was built without a CUDA compiler"
    return ""


@functools.cache
def compiled_variant_names() -> frozenset[str]:
    return frozenset(row["name"] for row in _ext.variants()) if with_kernels() else frozenset()


@functools.cache
def register_targets() -> bool:
    """Registers the CUDA handlers once; False when there are none to register."""
    if not with_kernels():
        return False
    for name, capsule in _ext.registrations().items():
        jax.ffi.register_ffi_target(name, capsule, platform="CUDA", api_version=1)
    return True


def warn_if_no_kernels() -> None:
    if not with_kernels():
        warnings.warn(f"jax_cluster: {why_no_kernels()}; every call falls back to XLA's dot. "
                      "See jax_cluster.info().", RuntimeWarning, stacklevel=3)
