import os

# Kernels fill their output with NaN before each launch, so a skipped element
# fails the comparison instead of passing on stale memory.
os.environ.setdefault("JAX_CLUSTER_POISON_OUTPUT", "1")

import jax  # noqa: E402
import pytest  # noqa: E402

# The fallback tests compare float32 dots with float64; on a GPU XLA's default
# would be TF32. The kernels (bf16/f16) ignore this setting.
jax.config.update("jax_default_matmul_precision", "highest")

import jax_cluster  # noqa: E402
from jax_cluster import _ffi  # noqa: E402


def _cuda_kernel_device():
    try:
        devices = jax.devices("gpu")
    except RuntimeError:
        return None
    if not devices or not _ffi.with_kernels():
        return None
    dev = jax_cluster.device.describe(devices[0])
    return devices[0] if dev.arch is not None else None


GPU = _cuda_kernel_device()


def pytest_collection_modifyitems(config, items):
    if GPU is not None:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (sm90/sm100) and a build with kernels")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def gpu():
    return GPU
