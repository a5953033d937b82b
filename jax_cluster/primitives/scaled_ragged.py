"""The block-scaled fp8 grouped GEMMs, DeepSeek-V3's recipe for MoE experts
on CUTLASS's blockwise-scaled array mainloop.

`scaled_ragged_dot` (ragged_m: the forward and the input gradient), the rows
of group g times group g's weight:
  a            [rows, K]               fp8 values, K-major
  b            [G, N, K]               fp8 values, each group's weight K-major
  scale_a      [rows, K/128]           float32: A's 1 x 128 tiles along K
  scale_b      [G, K/128, ceil(N/128)] float32: each group's 128 x 128 blocks
Scale blocks never meet a group boundary there: A's tiles run along K within
one row, and B's blocks belong to one group's matrix. Rows past the groups
are zero.

MXFP8 (sm100f) takes the same call with e8m0 scales, one per 32 values along
K of A and of each group's B, in the kernel's layouts (primitives/mx_scales.py):
  scale_a      [grouped_layout_size(rows, G, K)]   each group's rows on a row tile
  scale_b      [G, layout_size(N, K)]
and K a multiple of 128 (the kernel's K tile).

`scaled_ragged_k_dot` (ragged_k: the weight gradient), out[g] = A_g B_g^T
over the rows (tokens) of group g, both operands in 1 x 128 tiles along the
rows, stored with the rows contiguous:
  a            [K', rows]              fp8 values
  b            [N', rows]              fp8 values
  scale_a      [rows/128, K']          float32
  scale_b      [rows/128, N']          float32
  -> [G, K', N']; a group without rows gives zeros.
The rows are in the block-aligned layout of primitives/token_tiles.py: each
group starts on a tile, so no tile has two groups' rows.

MXFP8 (sm100f) takes the same call with e8m0 scales, one per 32 rows of a
column, each operand's in one kernel layout of the whole operand (rows as K):
  scale_a      [layout_size(K', rows)]
  scale_b      [layout_size(N', rows)]
A 32-row block never holds two groups either (a tile is four of them).

group_sizes is int32 [G] in both. Sizes follow ragged_dot's rule (a
negative size counts as 0, groups are cut at the rows). The ops take one
device, have no vmap rule and are not differentiable: the fp8 training
recipe quantizes each product itself.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jax_cluster.planning.call import Call
from jax_cluster.planning.plan import Plan, dtype_name
from jax_cluster.planning.tables import MX_DTYPE, MX_SCALE_BLOCK, SCALE_BLOCK
from jax_cluster.primitives import mx_scales, plans
from jax_cluster.primitives.lowering import scaled_ragged_local_p
from jax_cluster.primitives.operands import check_scaled_operands

_WHO = "jax_cluster scaled_ragged_dot"


def _check(a, b, scale_a, scale_b, group_sizes, out_dtype) -> tuple[int, int, int, int]:
    if a.ndim != 2 or b.ndim != 3:
        raise ValueError(f"{_WHO}: a must be [rows, K] and b [G, N, K], got shapes {a.shape} and {b.shape}")
    (rows, k), (groups, n, kb) = a.shape, b.shape
    if k != kb:
        raise ValueError(f"{_WHO}: contracting dimensions differ: a {a.shape} has K={k}, b {b.shape} has K={kb}")
    if group_sizes.ndim != 1 or group_sizes.shape[0] != groups or group_sizes.dtype != jnp.int32:
        raise ValueError(
            f"{_WHO}: group_sizes must be int32 [{groups}] (one per group of b), got "
            f"{group_sizes.dtype} {list(group_sizes.shape)}"
        )
    if mx_scales.is_mx_scale(scale_a):
        if k % SCALE_BLOCK:  # the MX kernel's K tile
            raise ValueError(f"{_WHO}: MX operands need K a multiple of {SCALE_BLOCK}, got K = {k}")
        scales = (
            ("scale_a", scale_a, (mx_scales.grouped_layout_size(rows, groups, k),)),
            ("scale_b", scale_b, (groups, mx_scales.layout_size(n, k))),
        )
        check_scaled_operands(_WHO, a, b, k, out_dtype, scales, block=MX_SCALE_BLOCK, scale_dtype=mx_scales.SCALE_DTYPE)
        return rows, n, k, groups
    blocks = k // SCALE_BLOCK
    check_scaled_operands(
        _WHO,
        a,
        b,
        k,
        out_dtype,
        (("scale_a", scale_a, (rows, blocks)), ("scale_b", scale_b, (groups, blocks, -(-n // SCALE_BLOCK)))),
    )
    return rows, n, k, groups


def _check_ragged_k(a, b, scale_a, scale_b, group_sizes, out_dtype) -> tuple[int, int, int, int]:
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"{_WHO}: a must be [K', rows] and b [N', rows], got shapes {a.shape} and {b.shape}")
    (m, rows), (n, rows_b) = a.shape, b.shape
    if rows != rows_b:
        raise ValueError(f"{_WHO}: a {a.shape} and b {b.shape} hold different row counts")
    if group_sizes.ndim != 1 or group_sizes.dtype != jnp.int32:
        raise ValueError(f"{_WHO}: group_sizes must be int32 [G], got {group_sizes.dtype} {list(group_sizes.shape)}")
    if mx_scales.is_mx_scale(scale_a):
        if rows % SCALE_BLOCK:  # the block-aligned layout's tile
            raise ValueError(f"{_WHO}: MX operands need the rows a multiple of {SCALE_BLOCK}, got {rows}")
        scales = (
            ("scale_a", scale_a, (mx_scales.layout_size(m, rows),)),
            ("scale_b", scale_b, (mx_scales.layout_size(n, rows),)),
        )
        check_scaled_operands(
            _WHO, a, b, rows, out_dtype, scales, block=MX_SCALE_BLOCK, scale_dtype=mx_scales.SCALE_DTYPE
        )
        return m, n, rows, group_sizes.shape[0]
    blocks = rows // SCALE_BLOCK
    check_scaled_operands(
        _WHO, a, b, rows, out_dtype, (("scale_a", scale_a, (blocks, m)), ("scale_b", scale_b, (blocks, n)))
    )
    return m, n, rows, group_sizes.shape[0]


def scaled_ragged_call(rows: int, n: int, k: int, groups: int, dtype, out_dtype, mx: bool = False) -> Call:
    """The Call of a block-scaled grouped GEMM (ragged_m; A and B K-major); `mx`: MXFP8 scales."""
    name = MX_DTYPE if mx else dtype_name(dtype)
    return Call("ragged_m", rows, n, k, groups, "k", "k", name, dtype_name(out_dtype))


def scaled_ragged_dot(
    a, b, scale_a, scale_b, group_sizes, *, out_dtype=jnp.bfloat16, plan: Plan | None = None, device=None
):
    """Binds the block-scaled grouped GEMM with `plan`, or with a fresh plan
    (the planner's kernel row, or the float32 fallback with the same semantics)."""
    rows, n, k, groups = _check(a, b, scale_a, scale_b, group_sizes, out_dtype)
    out_dtype = np.dtype(out_dtype)
    call = scaled_ragged_call(rows, n, k, groups, a.dtype, out_dtype, mx_scales.is_mx_scale(scale_a))
    plan = plans.choose(call, plan, device, _WHO)
    return scaled_ragged_local_p.bind(
        a, b, scale_a, scale_b, group_sizes, problem="ragged_m", out_dtype=out_dtype, plan=plan
    )


def scaled_ragged_k_call(m: int, n: int, rows: int, groups: int, dtype, out_dtype, mx: bool = False) -> Call:
    """The Call of a block-scaled weight gradient (ragged_k; A [K', rows] and
    B [N', rows], both K-major in the GEMM view (m, n, k) = (K', N', rows));
    `mx`: MXFP8 scales."""
    name = MX_DTYPE if mx else dtype_name(dtype)
    return Call("ragged_k", m, n, rows, groups, "k", "k", name, dtype_name(out_dtype))


def scaled_ragged_k_dot(
    a, b, scale_a, scale_b, group_sizes, *, out_dtype=jnp.bfloat16, plan: Plan | None = None, device=None
):
    """Binds the block-scaled weight-gradient GEMM with `plan`, or with a fresh
    plan (the planner's kernel row, or the float32 fallback with the same semantics)."""
    m, n, rows, groups = _check_ragged_k(a, b, scale_a, scale_b, group_sizes, out_dtype)
    out_dtype = np.dtype(out_dtype)
    call = scaled_ragged_k_call(m, n, rows, groups, a.dtype, out_dtype, mx_scales.is_mx_scale(scale_a))
    plan = plans.choose(call, plan, device, _WHO)
    return scaled_ragged_local_p.bind(
        a, b, scale_a, scale_b, group_sizes, problem="ragged_k", out_dtype=out_dtype, plan=plan
    )
