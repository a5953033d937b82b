"""Grouped products of block-scaled fp8 operands (qwix QArrays from
`jax_cluster.quantize`) on the block-scaled grouped kernel.

lhs [M, K] comes in (1, 128) tiles along K, so its scales [M, K/128] are
the kernel's as they are; rhs in (128, 128) blocks of each group's matrix,
stored [G, K, N] ("gkn") or [G, N, K] ("gnk"). The kernel reads each group's
B as [N, K], so "gkn" transposes rhs's fp8 values (1 byte each) and keeps its
scales, and "gnk" transposes only the scales. MXFP8 operands (e8m0 scales,
lhs in (1, 32) blocks, each group's weight in 32 values along K) run the
sm100f MX grouped kernel, their scales reordered into its layouts
(primitives/mx_scales.py). `scaled_grouped_product` returns None where no
kernel plan takes the call (the planner has no validated row, another GPU, a
CPU, e5m2, a plan of another dtype): the op then dequantizes to bfloat16.

`grouped_weight_gradient` is the recipe's third product, sum over group g's
rows of x^T dy: both operands in 1 x 128 tiles along the rows, laid out so
that each group starts on a tile (primitives/token_tiles.py), on the
block-scaled ragged_k kernel, or dequantized onto the bf16 one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_cluster.ops.quantize import MX_ROW_BLOCK, quantize
from jax_cluster.planning.plan import Plan
from jax_cluster.planning.tables import BLOCK_SCALED_DTYPES, MX_SCALE_BLOCK, SCALE_BLOCK
from jax_cluster.primitives import mx_scales, plans, token_tiles
from jax_cluster.primitives.lowering import clamp_group_sizes
from jax_cluster.primitives.operands import SCALED_DTYPES
from jax_cluster.primitives.ragged import ragged
from jax_cluster.primitives.scaled_ragged import (
    scaled_ragged_call,
    scaled_ragged_dot,
    scaled_ragged_k_call,
    scaled_ragged_k_dot,
)
from jax_cluster.primitives.token_tile_quantize import quantize_token_tiles

E4M3 = jnp.dtype(jnp.float8_e4m3fn)


def scaled_grouped_product(lhs, rhs, group_sizes, rhs_layout: str, out_dtype, plan: Plan | None):
    """lhs . rhs[g] over each group's rows on the block-scaled grouped kernel,
    [M, N]; None when no kernel plan takes it. group_sizes is int32 [G], or
    [S, G] for S row blocks (`plan`, if given, is one block's)."""
    values = lhs.qvalue
    if values.ndim != 2 or rhs.qvalue.ndim != 3:
        return None  # the dequantized path names the shapes it wants
    if mx_scales.is_mx_scale(lhs.scale):
        return _mx_grouped_product(lhs, rhs, group_sizes, rhs_layout, out_dtype, plan)
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
    call = scaled_ragged_call(rows // _blocks(group_sizes), n, k, groups, values.dtype, out_dtype)
    chosen = plans.choose(call, plan, None, "jax_cluster")
    if not chosen.uses_kernel:
        return None
    scale_a = lhs.scale.reshape(rows, k // SCALE_BLOCK)
    return scaled_ragged_dot(values, b, scale_a, scale_b, group_sizes, out_dtype=out_dtype, plan=chosen)


def _mx_grouped_product(lhs, rhs, group_sizes, rhs_layout: str, out_dtype, plan: Plan | None):
    """MXFP8 lhs [M, K] (1 x 32 blocks) . rhs[g] on the sm100f MX grouped
    kernel, [M, N]; None when no plan takes it. Each group's weight must
    share its scales along K: (32, 1) blocks of "gkn", (1, 32) of "gnk"."""
    values = lhs.qvalue
    rows, k = values.shape
    if rhs_layout == "gkn":  # [G, K, N]: the kernel reads [G, N, K]
        b, scale_b = rhs.qvalue.transpose(0, 2, 1), rhs.scale.transpose(0, 2, 1)
    else:
        b, scale_b = rhs.qvalue, rhs.scale
    if b.shape[2] // scale_b.shape[2] != MX_SCALE_BLOCK:
        return None  # the weight's 32 values share a scale across N, not K
    groups, n = b.shape[0], b.shape[1]
    blocks = _blocks(group_sizes)
    call = scaled_ragged_call(rows // blocks, n, k, groups, values.dtype, out_dtype, mx=True)
    chosen = plans.choose(call, plan, None, "jax_cluster")
    if not chosen.uses_kernel:
        return None
    # each row block's A scales in a grouped layout of its own, block after block
    by_block = lhs.scale.reshape(blocks, rows // blocks, k // MX_SCALE_BLOCK)
    sizes = group_sizes.reshape(blocks, groups)
    scale_a = jax.vmap(lambda s, g: mx_scales.grouped_to_kernel_layout(s, clamp_group_sizes(g, rows // blocks), k))(
        by_block, sizes
    ).reshape(-1)
    scale_b = jax.vmap(lambda s: mx_scales.to_kernel_layout(s, k))(scale_b)
    return scaled_ragged_dot(values, b, scale_a, scale_b, group_sizes, out_dtype=out_dtype, plan=chosen)


def _blocks(group_sizes) -> int:
    """S of [S, G] group sizes (row blocks); 1 for [G]."""
    return group_sizes.shape[0] if group_sizes.ndim == 2 else 1


def token_tiled(x, sizes, rows: int, dtype, use_kernel: bool | None = None):
    """x [M, C], its rows sorted by group, in the block-aligned layout as
    (values [C, rows] fp8, scales [rows/128, C] float32): one scale per 128
    rows of a column, amax over the format's largest value (1 for an all-zero
    tile), zeros between groups (primitives/token_tile_quantize.py: one
    kernel, or XLA's gather, tile reduction and scaling pass)."""
    return quantize_token_tiles(x, sizes, rows, dtype, use_kernel=use_kernel)


def _dequantized_rows(values, scales, dtype):
    """[rows, C] in `dtype` from token_tiled's (values, scales)."""
    return (values.T.astype(jnp.float32) * jnp.repeat(scales, SCALE_BLOCK, axis=0)).astype(dtype)


def _clamped(group_sizes, rows: int):
    """Sizes under ragged_dot's rule, each row block's cut at its `rows`."""
    if group_sizes.ndim == 2:
        return jax.vmap(lambda g: clamp_group_sizes(g, rows))(group_sizes)
    return clamp_group_sizes(group_sizes, rows)


def grouped_weight_gradient(
    x, dy, group_sizes, grad_dtype, out_dtype, plan: Plan | None = None, quantize_kernel: bool | None = None
):
    """[G, K, N]: x [M, K]^T dy [M, N] over each group's rows, x quantized to
    e4m3 and dy to `grad_dtype` in token tiles (`quantize_kernel`: the
    token-tile kernel, None for the default); the block-scaled ragged_k
    kernel where a plan (`plan`, or the planner's; one row block's) takes it,
    else the same fp8 values dequantized to bfloat16 on the bf16 grouped
    path. group_sizes is int32 [G], or [S, G] for S row blocks (summed)."""
    groups, blocks = group_sizes.shape[-1], _blocks(group_sizes)
    block_rows = x.shape[0] // blocks
    rows = token_tiles.padded_rows(block_rows, groups)  # one block's layout
    sizes = _clamped(group_sizes, block_rows)
    # the raw sizes: the quantization cuts them itself (XLA merges that cut with the one above)
    (xq, x_scales), (dyq, dy_scales) = (
        token_tiled(v, group_sizes, rows, d, quantize_kernel) for v, d in ((x, E4M3), (dy, grad_dtype))
    )
    k, n = x.shape[1], dy.shape[1]
    if xq.dtype == dyq.dtype:
        call = scaled_ragged_k_call(k, n, rows, groups, xq.dtype, out_dtype)
        plan = plans.choose(call, plan, None, "jax_cluster")
        if plan.uses_kernel:
            return scaled_ragged_k_dot(xq, dyq, x_scales, dy_scales, sizes, out_dtype=out_dtype, plan=plan)
    # each group over its whole span (the rows between groups are zeros)
    spans = jax.vmap(lambda g: token_tiles.group_spans(g, rows))(sizes.reshape(blocks, groups))
    xv, dyv = _dequantized_rows(xq, x_scales, jnp.bfloat16), _dequantized_rows(dyq, dy_scales, jnp.bfloat16)
    return ragged(xv, dyv, spans if blocks > 1 else spans[0], problem="ragged_k", out_dtype=out_dtype)


def mx_weight_gradient(x, dy, group_sizes, out_dtype, plan: Plan | None = None):
    """[G, K, N]: x [M, K]^T dy [M, N] over each group's rows in MXFP8 on the
    sm100f MX ragged_k kernel, or None where no plan (`plan`, or the
    planner's; one row block's) takes it. Both operands go to the
    block-aligned row layout (each group on its own 128-row tiles, zeros
    between), transposed so the rows are contiguous, and are scaled in
    blocks of 32 rows: a block never holds two groups. group_sizes is int32
    [G], or [S, G] for S row blocks, each on a layout of its own (summed)."""
    groups, blocks = group_sizes.shape[-1], _blocks(group_sizes)
    block_rows = x.shape[0] // blocks
    rows = token_tiles.padded_rows(block_rows, groups)
    k, n = x.shape[1], dy.shape[1]
    call = scaled_ragged_k_call(k, n, rows, groups, E4M3, out_dtype, mx=True)
    chosen = plans.choose(call, plan, None, "jax_cluster")
    if not chosen.uses_kernel:
        return None
    sizes = _clamped(group_sizes, block_rows)
    by_block = sizes.reshape(blocks, groups)

    def operand(v):  # [C, blocks * rows] values and each block's scale layout, one after another
        laid = jax.vmap(lambda xs, g: token_tiles.laid_out(xs, g, rows))(v.reshape(blocks, block_rows, -1), by_block)
        q = quantize(laid.reshape(blocks * rows, -1).T, block=MX_ROW_BLOCK)
        per_block = q.scale.reshape(q.scale.shape[0], blocks, -1).transpose(1, 0, 2)
        return q.qvalue, jax.vmap(lambda sc: mx_scales.to_kernel_layout(sc, rows))(per_block).reshape(-1)

    (xq, scale_a), (dyq, scale_b) = operand(x), operand(dy)
    return scaled_ragged_k_dot(xq, dyq, scale_a, scale_b, sizes, out_dtype=out_dtype, plan=chosen)
