"""Loads the compiled extension and registers its FFI targets with XLA."""

from __future__ import annotations

import functools
import os
import pathlib
import warnings

import jax

try:
    import jax_cluster._ext as _ext

    _IMPORT_ERROR: Exception | None = None
except ImportError as exc:  # a source checkout that was never built
    _ext = None
    _IMPORT_ERROR = exc


def extension():
    """The nanobind module, or None when it is missing."""
    return _ext


def with_kernels() -> bool:
    return _ext is not None and bool(_ext.with_cuda)


def _missing_extension() -> str:
    package = pathlib.Path(__file__).parent
    if not any(package.glob("_ext*.so")) and (package.parent / "pyproject.toml").exists():
        return (
            f"the compiled extension is missing: {package} is a source checkout that was never built. "
            "Build and install it (bash scripts/setup.sh, or pip install .), then run from outside the "
            "checkout (another directory, or python -P) so the installed package is imported"
        )
    return f"the compiled extension is missing ({_IMPORT_ERROR})"


def why_no_kernels() -> str:
    if _ext is None:
        return _missing_extension()
    if not _ext.with_cuda:
        return "the package was built without a CUDA compiler"
    return ""


@functools.cache
def compiled_variant_names() -> frozenset[str]:
    return frozenset(row["name"] for row in _ext.variants()) if with_kernels() else frozenset()


# The handlers' per-call-site state (the Plan resolved once, at instantiation).
_STATE_TYPE = "jax_cluster_plan_state"


def command_buffers_enabled() -> bool:
    """Whether XLA may trace the kernels' calls into its command buffers (CUDA
    graphs). JAX_CLUSTER_COMMAND_BUFFERS=0 runs each call as its own thunk."""
    return os.environ.get("JAX_CLUSTER_COMMAND_BUFFERS", "1") != "0"


@functools.cache
def register_targets() -> bool:
    """Registers the CUDA handlers once; False when there are none to register."""
    if not with_kernels():
        return False
    jax.ffi.register_ffi_type(_STATE_TYPE, _ext.state_type(), platform="CUDA")
    for name, stages in _ext.registrations(command_buffers_enabled()).items():
        jax.ffi.register_ffi_target(name, stages, platform="CUDA", api_version=1)
    return True


def warn_if_no_kernels() -> None:
    if not with_kernels():
        warnings.warn(
            f"jax_cluster: {why_no_kernels()}; every call falls back to XLA's dot. See jax_cluster.info().",
            RuntimeWarning,
            stacklevel=3,
        )
