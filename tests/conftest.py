"""Shared by the three test folders: cpu/ (no GPU, no kernels needed), native/
(the build: the compiled extension and its machine code) and gpu/ (a Hopper or Blackwell
GPU with kernels for it; every test there carries the `gpu` marker and skips
with the reason below)."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # helpers.py for every folder
# Kernels fill their output with NaN before each launch, so a skipped element
# fails the comparison instead of passing on stale memory.
os.environ.setdefault("JAX_CLUSTER_POISON_OUTPUT", "1")
# The tests exercise the kernels wherever one fits; the measured routing to
# XLA's dot is tested on its own (route="measured" in test_routing.py).
os.environ.setdefault("JAX_CLUSTER_ROUTE", "kernel")

import jax  # noqa: E402
import pytest  # noqa: E402

# The fallback tests compare float32 dots with float64; on a GPU XLA's default
# would be TF32. The kernels (bf16/f16) ignore this setting.
jax.config.update("jax_default_matmul_precision", "highest")

import jax_cluster  # noqa: E402
from jax_cluster import _ffi  # noqa: E402
from jax_cluster.planning.device import describe  # noqa: E402


def _cuda_kernel_device():
    """(the device the GPU tests run on, or None; why not)."""
    try:
        devices = jax.devices("gpu")
    except RuntimeError:
        devices = []
    if not devices:
        return None, "no CUDA GPU"
    if not _ffi.with_kernels():
        # a GPU but no kernels: often a source tree shadowing the installed wheel
        # (python -m pytest from the repository root puts it first on sys.path)
        return None, (
            f"a GPU, but jax_cluster from {os.path.dirname(jax_cluster.__file__)} "
            f"has no kernels: {_ffi.why_no_kernels()}"
        )
    dev = describe(devices[0])
    if dev.arch is None:
        return None, f"{dev.name} is neither sm90 nor sm100"
    return devices[0], ""


GPU, WHY_NO_GPU = _cuda_kernel_device()


def pytest_collection_modifyitems(config, items):
    if GPU is not None:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU (sm90/sm100) and a build with kernels: {WHY_NO_GPU}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def gpu():
    return GPU


@pytest.fixture
def autotune_cache_dir(tmp_path, monkeypatch):
    """An autotune cache folder of the test's own, with reading off at the start and the end."""
    from jax_cluster.planning import autotune_cache

    monkeypatch.setenv("JAX_CLUSTER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("JAX_CLUSTER_AUTOTUNE", raising=False)
    monkeypatch.setattr(autotune_cache, "_warned_stale", set())
    jax_cluster.use_autotune_cache(None)
    yield tmp_path
    jax_cluster.use_autotune_cache(None)
