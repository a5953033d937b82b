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


# Why XLA refused the handlers, once it has (then no call takes a kernel).
_refused = ""


def with_kernels() -> bool:
    """Whether the extension has kernels XLA takes: built with CUDA, its handlers not refused."""
    return _ext is not None and bool(_ext.with_cuda) and not _refused


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
    return _refused


@functools.cache
def built_archs() -> tuple[str, ...]:
    """The archs the extension has machine code for ("sm90a", ...); none without kernels."""
    return tuple(a for a in _ext.built_archs.split(",") if a) if with_kernels() else ()


@functools.cache
def compiled_variant_names() -> frozenset[str]:
    return frozenset(row["name"] for row in _ext.variants()) if with_kernels() else frozenset()


# The handlers' per-call-site state (the Plan resolved once, at instantiation).
_STATE_TYPE = "jax_cluster_plan_state"


def command_buffers_enabled() -> bool:
    """Whether XLA may trace the kernels' calls into its command buffers (CUDA
    graphs). JAX_CLUSTER_COMMAND_BUFFERS=0 runs each call as its own thunk."""
    return os.environ.get("JAX_CLUSTER_COMMAND_BUFFERS", "1") != "0"


def record_stage_requested() -> bool:
    """Whether kernel calls inside XLA's command buffers are recorded as kernel
    nodes whose parameters XLA updates when the buffers move, rather than
    captured from the execute handler into a new graph each time (the default;
    JAX_CLUSTER_RECORD=0 captures them)."""
    return os.environ.get("JAX_CLUSTER_RECORD", "1") != "0"


def record_counts() -> dict[str, int]:
    """Commands the record stage created and updated in this process, the calls
    it left to XLA's capture, and the calls whose launches it kept from an
    earlier call with the same buffers (all zero without kernels)."""
    if with_kernels():
        return dict(_ext.record_counts())
    return {"created": 0, "updated": 0, "captured": 0, "reused": 0}


def kept_params_counts() -> dict[str, int]:
    """Dense launches whose parameters were described afresh and kept, and
    launches made from kept parameters moved to the call's buffers, in this
    process (both zero without kernels)."""
    if with_kernels():
        return dict(_ext.kept_params_counts())
    return {"kept": 0, "repointed": 0}


# A no-op target: registering it makes XLA call it, which shows the extension
# the XLA FFI API it needs to register handlers with a record stage.
_PROBE_TARGET = "jax_cluster_ffi_api_probe"


@functools.cache
def register_targets() -> bool:
    """Registers the CUDA handlers once; False when there are none to register
    or XLA refuses them (then every call takes XLA's path, with a warning)."""
    global _refused
    if not with_kernels():
        return False
    try:
        jax.ffi.register_ffi_type(_STATE_TYPE, _ext.state_type(), platform="CUDA")
        recorded = recorded_targets()
        for name, stages in _ext.registrations(command_buffers_enabled()).items():
            if name not in recorded:
                jax.ffi.register_ffi_target(name, stages, platform="CUDA", api_version=1)
    except jax.errors.JaxRuntimeError as exc:
        _refused = _refusal_text(exc)
        warn_if_no_kernels()
        return False
    return True


def _refusal_text(exc: Exception) -> str:
    said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    why = f"XLA refused the extension's FFI handlers ({said})"
    if "API version" in said:  # built against another jaxlib's XLA FFI headers
        why += (
            f"; the extension was built against another jax's XLA FFI than the installed jax "
            f"{jax.__version__}: rebuild it against this one (pip install --no-build-isolation .)"
        )
    return why


@functools.cache
def recorded_targets() -> frozenset[str]:
    """The targets registered with a record stage (none unless requested and
    XLA showed its FFI API to the probe)."""
    if not (with_kernels() and command_buffers_enabled() and record_stage_requested()):
        return frozenset()
    jax.ffi.register_ffi_target(_PROBE_TARGET, _ext.ffi_api_probe(), platform="CUDA", api_version=1)
    if not _ext.ffi_api_captured():
        warnings.warn(
            "jax_cluster: the record stage is on, but XLA did not call the probe handler, so the "
            "kernel calls are captured into XLA's command buffers as before",
            RuntimeWarning,
            stacklevel=2,
        )
        return frozenset()
    try:
        return frozenset(_ext.register_with_record("CUDA"))
    except RuntimeError as exc:  # XLA refused the bundle: the targets register as usual
        warnings.warn(f"jax_cluster: no record stage ({exc}); kernel calls are captured as before", stacklevel=2)
        return frozenset()


def warn_if_no_kernels() -> None:
    if not with_kernels():
        warnings.warn(
            f"jax_cluster: {why_no_kernels()}; every call falls back to XLA's dot. See jax_cluster.info().",
            RuntimeWarning,
            stacklevel=3,
        )
