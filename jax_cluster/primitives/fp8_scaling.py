"""What the fp8 quantization primitives share: the formats their kernels
take, the devices that run them, and the scaling rule of their XLA forms,
which the kernels (kernels/fp8_quantize.cuh) reproduce bit for bit.

A block's scale is its amax times the float32 reciprocal of the format's
largest value (1 for an all-zero block, or one whose amax is NaN); its
values are x times 1 / scale, clipped to the format, rounded to nearest
even. Both are written as products because that is what XLA makes of a
division by a constant or by a broadcast on the GPU.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jax_cluster import _ffi
from jax_cluster.planning.device import describe

# what the kernels read and write (kernels/fp8_quantize.h)
KERNEL_INPUTS = tuple(jnp.dtype(d) for d in (jnp.bfloat16, jnp.float16, jnp.float32))
KERNEL_OUTPUTS = tuple(jnp.dtype(d) for d in (jnp.float8_e4m3fn, jnp.float8_e5m2))


def kernel_formats(x_dtype, dtype) -> bool:
    """Whether the kernels read `x_dtype` and write `dtype`."""
    return jnp.dtype(x_dtype) in KERNEL_INPUTS and jnp.dtype(dtype) in KERNEL_OUTPUTS


def device_runs_kernels(device=None) -> bool:
    """Whether a device (default: the first) runs the kernels' machine code:
    they are built for the extension's archs, each running on the compute
    capabilities contract.json lists (sm_90a on 9.0, family-specific sm_100f
    on 10.0 and 10.3)."""
    return describe(device).arch in _ffi.built_archs()


def largest(dtype) -> float:
    """The largest finite value of an fp8 format."""
    return float(jnp.finfo(dtype).max)


def block_scales(amax, dtype):
    """float32 scales from the blocks' float32 amax."""
    return jnp.where(amax > 0, amax * np.float32(1.0 / largest(dtype)), 1.0)


def scaled_values(x, inverse, dtype):
    """x (float32) times the broadcast reciprocals of its scales, in `dtype`."""
    top = largest(dtype)
    return jnp.clip(x * inverse, -top, top).astype(dtype)
