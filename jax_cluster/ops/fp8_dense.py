"""Dense products of block-scaled fp8 operands (qwix QArrays from
`jax_cluster.quantize`) on the block-scaled kernel.

lhs [..., M, K] comes in (1, 128) tiles along K; rhs in (128, 128) blocks,
stored [K, N] (the matmul form) or [N, K]. The kernel reads B [N, K], so the
[K, N] form transposes rhs's fp8 values (1 byte each) and keeps its scales,
and the [N, K] form transposes only the scales. `scaled_product` returns None
where no kernel plan takes the call (another GPU, a CPU, e5m2, M not a
multiple of 4, a plan of another dtype): the ops then dequantize to bfloat16.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from jax_cluster.planning.plan import Plan
from jax_cluster.planning.tables import BLOCK_SCALED_DTYPES, SCALE_BLOCK
from jax_cluster.primitives import plans
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
    scale_a = lhs.scale.reshape(rows, k // SCALE_BLOCK).T
    b, scale_b = (rhs.qvalue.T, rhs.scale) if rhs_contracting == 0 else (rhs.qvalue, rhs.scale.T)
    chosen = plans.choose(scaled_gemm_call(rows, b.shape[0], k, a.dtype, out_dtype), plan, None, "jax_cluster")
    if not chosen.uses_kernel:
        return None
    out = scaled_gemm(a, b, scale_a, scale_b, out_dtype=out_dtype, plan=chosen)
    return out.reshape(*values.shape[:-1], b.shape[0])
