"""Dense products of block-scaled fp8 operands (qwix QArrays from
`jax_cluster.quantize`) on the block-scaled kernel.

lhs [..., M, K] comes in (1, 128) tiles along K; rhs in (128, 128) blocks,
stored [K, N] (the matmul form) or [N, K]. The kernel reads B [N, K], so the
[K, N] form transposes rhs's fp8 values (1 byte each) and keeps its scales,
and the [N, K] form transposes only the scales. MXFP8 operands (e8m0 scales,
one per 32 values along K: lhs in (1, 32) tiles, rhs [K, N] in (32, 1) or
[N, K] in (1, 32)) run the sm100f MX kernel, their scales reordered into
its layout (primitives/mx_scales.py). `scaled_product` returns None where no
kernel plan takes the call (another GPU, a CPU, e5m2, M not a multiple of 4,
an MX weight tiled across K's other axis, a plan of another dtype): the ops
then dequantize to bfloat16.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from jax_cluster.planning.plan import Plan
from jax_cluster.planning.tables import BLOCK_SCALED_DTYPES, MX_SCALE_BLOCK, SCALE_BLOCK
from jax_cluster.primitives import mx_scales, plans
from jax_cluster.primitives.operands import SCALED_DTYPES
from jax_cluster.primitives.scaled_gemm import scaled_gemm, scaled_gemm_call


def scaled_product(lhs, rhs, rhs_contracting: int, out_dtype, plan: Plan | None):
    """lhs . rhs over K on the block-scaled kernel, [..., M, N]; None when no
    kernel plan takes it. rhs_contracting is rhs's K axis: 0 ([K, N]) or 1 ([N, K])."""
    values = lhs.qvalue
    if values.dtype != rhs.qvalue.dtype or jnp.dtype(values.dtype) not in SCALED_DTYPES:
        return None
    if plan is not None and plan.call.dtype not in BLOCK_SCALED_DTYPES:
        return None  # a plan for the dequantized product
    k = values.shape[-1]
    rows = math.prod(values.shape[:-1])
    a = values.reshape(rows, k)
    if mx_scales.is_mx_scale(lhs.scale):
        out = _mx_product(a, lhs.scale.reshape(rows, k // MX_SCALE_BLOCK), rhs, rhs_contracting, out_dtype, plan)
    else:
        out = _blockwise_product(a, lhs.scale.reshape(rows, k // SCALE_BLOCK), rhs, rhs_contracting, out_dtype, plan)
    return None if out is None else out.reshape(*values.shape[:-1], out.shape[-1])


def _blockwise_product(a, scale_a, rhs, rhs_contracting: int, out_dtype, plan: Plan | None):
    """a [M, K] . rhs on the sm90a block-scaled kernel, [M, N]; None when no
    plan takes it. scale_a [M, K/128]: one float32 scale per 128 values of a row."""
    rows, k = a.shape
    b, scale_b = (rhs.qvalue.T, rhs.scale) if rhs_contracting == 0 else (rhs.qvalue, rhs.scale.T)
    chosen = plans.choose(scaled_gemm_call(rows, b.shape[0], k, a.dtype, out_dtype), plan, None, "jax_cluster")
    if not chosen.uses_kernel:
        return None
    return scaled_gemm(a, b, scale_a.T, scale_b, out_dtype=out_dtype, plan=chosen)


def _mx_product(a, scale_a, rhs, rhs_contracting: int, out_dtype, plan: Plan | None):
    """a [M, K] . rhs on the MX kernel, [M, N]; None when no plan takes it.
    scale_a [M, K/32]: one scale per 32 values of a row."""
    (rows, k), per_k = a.shape, rhs.qvalue.shape[rhs_contracting] // rhs.scale.shape[rhs_contracting]
    if per_k != MX_SCALE_BLOCK:
        return None  # the weight's 32 values share a scale across N, not K
    b, scale_b = (rhs.qvalue.T, rhs.scale.T) if rhs_contracting == 0 else (rhs.qvalue, rhs.scale)
    call = scaled_gemm_call(rows, b.shape[0], k, a.dtype, out_dtype, mx=True)
    chosen = plans.choose(call, plan, None, "jax_cluster")
    if not chosen.uses_kernel:
        return None
    sa, sb = mx_scales.to_kernel_layout(scale_a, k), mx_scales.to_kernel_layout(scale_b, k)
    return scaled_gemm(a, b, sa, sb, out_dtype=out_dtype, plan=chosen)
