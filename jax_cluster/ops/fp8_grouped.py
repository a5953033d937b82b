"""Grouped products of block-scaled fp8 operands (qwix QArrays from
`jax_cluster.quantize`) on the block-scaled grouped kernel.

lhs [M, K] comes in (1, 128) tiles along K, so its scales [M, K/128] are
the kernel's as they are; rhs in (128, 128) blocks of each group's matrix,
stored [G, K, N] ("gkn") or [G, N, K] ("gnk"). The kernel reads each group's
B as [N, K], so "gkn" transposes rhs's fp8 values (1 byte each) and keeps its
scales, and "gnk" transposes only the scales. `scaled_grouped_product`
returns None where no kernel plan takes the call (the planner has no
validated row, another GPU, a CPU, e5m2, MXFP8 operands, a plan of another
dtype): the op then dequantizes to bfloat16.
"""

from __future__ import annotations

import jax.numpy as jnp

from jax_cluster.planning.plan import Plan
from jax_cluster.planning.tables import BLOCK_SCALED_DTYPES, SCALE_BLOCK
from jax_cluster.primitives import plans
from jax_cluster.primitives.mx_scales import is_mx_scale
from jax_cluster.primitives.operands import SCALED_DTYPES
from jax_cluster.primitives.scaled_ragged import scaled_ragged_call, scaled_ragged_dot


def scaled_grouped_product(lhs, rhs, group_sizes, rhs_layout: str, out_dtype, plan: Plan | None):
    """lhs . rhs[g] over each group's rows on the block-scaled grouped kernel,
    [M, N]; None when no kernel plan takes it. group_sizes is int32 [G]."""
    values = lhs.qvalue
    if values.ndim != 2 or rhs.qvalue.ndim != 3:
        return None  # the dequantized path names the shapes it wants
    if is_mx_scale(lhs.scale):
        return None  # MXFP8: no grouped kernel takes its scales
    if values.dtype != rhs.qvalue.dtype or jnp.dtype(values.dtype) not in SCALED_DTYPES:
        return None
    if plan is not None and plan.call.dtype not in BLOCK_SCALED_DTYPES:
        return None  # a plan for the dequantized product
    rows, k = values.shape
    if rhs_layout == "gkn":
        b, scale_b = rhs.qvalue.transpose(0, 2, 1), rhs.scale
    else:
        b, scale_b = rhs.qvalue, rhs.scale.transpose(0, 2, 1)
    groups, n = b.shape[0], b.shape[1]
    call = scaled_ragged_call(rows, n, k, groups, values.dtype, out_dtype)
    chosen = plans.choose(call, plan, None, "jax_cluster")
    if not chosen.uses_kernel:
        return None
    scale_a = lhs.scale.reshape(rows, k // SCALE_BLOCK)
    return scaled_ragged_dot(values, b, scale_a, scale_b, group_sizes, out_dtype=out_dtype, plan=chosen)
