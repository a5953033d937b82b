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

group_sizes is int32 [G], or [S, G] for S row blocks (ragged_dot's
data-parallel form): the rows are then S equal blocks, each grouped by its
own sizes as if it were its own call. Each block-sized part of a, of
scale_a (and for ragged_k of b and scale_b) is that block's: ragged_m's
rows, ragged_k's block-aligned rows (each block its own layout of
rows / S rows), and MX's flat scale layouts, one after another. ragged_m
writes each block's rows; ragged_k sums the blocks' products. Sizes follow
ragged_dot's rule (a negative size counts as 0, groups are cut at the rows).

Over a mesh each shard runs its own blocks, planned for one block's local
shape: the blocks split (ragged_k then sums the partials with a psum); for
blockwise scales also ragged_m's N (N/shards a multiple of 128) and K
(K/shards a multiple of 128: partials and a psum), and ragged_k's K' and N'.
Partials are added in float32 (plans.for_partials: the kernels write bf16).
The rows of one block are never split (its groups are one sorted run). vmap
runs a loop over the mapped axis. The ops are not differentiable: the fp8
training recipe quantizes each product itself.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding

from jax_cluster.planning.call import Call
from jax_cluster.planning.plan import Plan, dtype_name
from jax_cluster.planning.tables import MX_DTYPE, MX_SCALE_BLOCK, SCALE_BLOCK
from jax_cluster.primitives import mx_scales, plans
from jax_cluster.primitives.lowering import scaled_ragged_local_p
from jax_cluster.primitives.operands import check_scaled_operands
from jax_cluster.primitives.registry import partitioned_primitive
from jax_cluster.primitives.specs import choose_axes, dim_axes, rule_options, spec_of, term, tied

_WHO = "jax_cluster scaled_ragged_dot"


def _blocks(group_sizes, rows: int, what: str, groups: int | None = None) -> int:
    """S, the row blocks of [S, G] sizes (1 for [G]), after checking that the
    sizes are int32 [G] or [S, G] and that S splits `rows` evenly."""
    want = f"[{groups}] or [S, {groups}]" if groups is not None else "[G] or [S, G]"
    if (
        group_sizes.ndim not in (1, 2)
        or group_sizes.dtype != jnp.int32
        or (groups is not None and group_sizes.shape[-1] != groups)
    ):
        raise ValueError(
            f"{_WHO}: group_sizes must be int32 {want} (one per group of b), got "
            f"{group_sizes.dtype} {list(group_sizes.shape)}"
        )
    blocks = group_sizes.shape[0] if group_sizes.ndim == 2 else 1
    if blocks == 0 or rows % blocks:
        raise ValueError(
            f"{_WHO}: group_sizes {list(group_sizes.shape)} splits the {rows} {what} into {blocks} blocks; "
            "they must be a positive multiple of it"
        )
    return blocks


def _check(a, b, scale_a, scale_b, group_sizes, out_dtype) -> tuple[int, int, int, int]:
    """(rows of one block, N, K, G) of a ragged_m call, or a clear error."""
    if a.ndim != 2 or b.ndim != 3:
        raise ValueError(f"{_WHO}: a must be [rows, K] and b [G, N, K], got shapes {a.shape} and {b.shape}")
    (rows, k), (groups, n, kb) = a.shape, b.shape
    if k != kb:
        raise ValueError(f"{_WHO}: contracting dimensions differ: a {a.shape} has K={k}, b {b.shape} has K={kb}")
    blocks = _blocks(group_sizes, rows, "rows", groups)
    block_rows = rows // blocks
    if mx_scales.is_mx_scale(scale_a):
        if k % SCALE_BLOCK:  # the MX kernel's K tile
            raise ValueError(f"{_WHO}: MX operands need K a multiple of {SCALE_BLOCK}, got K = {k}")
        scales = (
            ("scale_a", scale_a, (blocks * mx_scales.grouped_layout_size(block_rows, groups, k),)),
            ("scale_b", scale_b, (groups, mx_scales.layout_size(n, k))),
        )
        check_scaled_operands(_WHO, a, b, k, out_dtype, scales, block=MX_SCALE_BLOCK, scale_dtype=mx_scales.SCALE_DTYPE)
        return block_rows, n, k, groups
    k_blocks = k // SCALE_BLOCK
    check_scaled_operands(
        _WHO,
        a,
        b,
        k,
        out_dtype,
        (("scale_a", scale_a, (rows, k_blocks)), ("scale_b", scale_b, (groups, k_blocks, -(-n // SCALE_BLOCK)))),
    )
    return block_rows, n, k, groups


def _check_ragged_k(a, b, scale_a, scale_b, group_sizes, out_dtype) -> tuple[int, int, int, int]:
    """(K', N', rows of one block, G) of a ragged_k call, or a clear error."""
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"{_WHO}: a must be [K', rows] and b [N', rows], got shapes {a.shape} and {b.shape}")
    (m, rows), (n, rows_b) = a.shape, b.shape
    if rows != rows_b:
        raise ValueError(f"{_WHO}: a {a.shape} and b {b.shape} hold different row counts")
    blocks = _blocks(group_sizes, rows, "block-aligned rows")
    block_rows = rows // blocks
    if block_rows % SCALE_BLOCK:  # each block's layout is whole tiles
        raise ValueError(f"{_WHO}: each block's rows must be a multiple of {SCALE_BLOCK}, got {block_rows}")
    if mx_scales.is_mx_scale(scale_a):
        scales = (
            ("scale_a", scale_a, (blocks * mx_scales.layout_size(m, block_rows),)),
            ("scale_b", scale_b, (blocks * mx_scales.layout_size(n, block_rows),)),
        )
        check_scaled_operands(
            _WHO, a, b, rows, out_dtype, scales, block=MX_SCALE_BLOCK, scale_dtype=mx_scales.SCALE_DTYPE
        )
        return m, n, block_rows, group_sizes.shape[-1]
    tiles = rows // SCALE_BLOCK
    check_scaled_operands(
        _WHO, a, b, rows, out_dtype, (("scale_a", scale_a, (tiles, m)), ("scale_b", scale_b, (tiles, n)))
    )
    return m, n, block_rows, group_sizes.shape[-1]


def scaled_ragged_call(rows: int, n: int, k: int, groups: int, dtype, out_dtype, mx: bool = False) -> Call:
    """The Call of a block-scaled grouped GEMM (ragged_m; A and B K-major); `mx`: MXFP8 scales."""
    name = MX_DTYPE if mx else dtype_name(dtype)
    return Call("ragged_m", rows, n, k, groups, "k", "k", name, dtype_name(out_dtype))


def _abstract_eval(a, b, scale_a, scale_b, group_sizes, *, problem, out_dtype, plan):
    if problem == "ragged_m":
        _check(a, b, scale_a, scale_b, group_sizes, out_dtype)
        return jax.core.ShapedArray((a.shape[0], b.shape[1]), out_dtype)
    _check_ragged_k(a, b, scale_a, scale_b, group_sizes, out_dtype)
    return jax.core.ShapedArray((group_sizes.shape[-1], a.shape[0], b.shape[0]), out_dtype)


def _block(x, axis: int, block: int, blocks: int):
    """Block `block` of `blocks` equal parts of x along `axis`."""
    size = x.shape[axis] // blocks
    return lax.slice_in_dim(x, block * size, (block + 1) * size, axis=axis)


def _by_block(a, b, scale_a, scale_b, group_sizes, problem, out_dtype, plan):
    """One grouped call per row block (plan: one block's); ragged_m stacks
    the blocks' rows, ragged_k adds their products in float32."""
    out_dtype = np.dtype(out_dtype)
    params = dict(problem=problem, out_dtype=out_dtype, plan=plan)
    if group_sizes.ndim == 1:
        return scaled_ragged_local_p.bind(a, b, scale_a, scale_b, group_sizes, **params)
    blocks = group_sizes.shape[0]
    if problem == "ragged_m":  # a's rows and scale_a (rows, or MX layouts) by block; b is shared
        outs = [
            scaled_ragged_local_p.bind(
                _block(a, 0, s, blocks), b, _block(scale_a, 0, s, blocks), scale_b, group_sizes[s], **params
            )
            for s in range(blocks)
        ]
        return lax.concatenate(outs, 0) if blocks > 1 else outs[0]
    # ragged_k: both operands' rows (their second axis) and both scales by block, added in float32
    if blocks > 1:
        p, partial_dtype = plans.for_partials(
            plan, lambda d: _block_call(a, b, scale_a, group_sizes, problem, d), out_dtype
        )
        params.update(out_dtype=partial_dtype, plan=p)
    total = None
    for s in range(blocks):
        part = scaled_ragged_local_p.bind(
            _block(a, 1, s, blocks),
            _block(b, 1, s, blocks),
            _block(scale_a, 0, s, blocks),
            _block(scale_b, 0, s, blocks),
            group_sizes[s],
            **params,
        ).astype(np.float32)
        total = part if total is None else total + part
    return total.astype(out_dtype)


# --------------------------------------------------------------------------- partitioning


def _whole(a, b, scale_a, scale_b, group_sizes, problem, out_dtype, plan):
    return _by_block(a, b, scale_a, scale_b, group_sizes, problem, out_dtype, plan)


def _sharding_rule(problem, out_dtype, plan, mesh, operand_types, result_types):
    # Row blocks are whole (the compound "(s r)", as in ragged_dot); a scale
    # axis is tied to its values' axis where whole scale blocks make it up
    # (specs.tied), and otherwise stays replicated.
    a, b, scale_a, scale_b, sizes = (tuple(t.shape) for t in operand_types)
    mx, blocks = len(scale_a) == 1, sizes[0] if len(sizes) == 2 else 1
    group_sizes = "s g" if len(sizes) == 2 else "g"
    rows, size_of = term(("s", blocks), ("r", (a[0] if problem == "ragged_m" else a[1]) // blocks))
    if problem == "ragged_m" and mx:  # each block's A scales one flat layout
        flat, s_flat = term(("s", blocks), ("sa", scale_a[0] // blocks))
        rule = f"{rows} k, g n k, {flat}, g sb, {group_sizes} -> {rows} n"
        return rule, rule_options(rule, replication=("r", "k", "sa", "sb"), sizes={**size_of, **s_flat})
    if problem == "ragged_m":  # scale_a [rows, K/128], scale_b [G, K/128, N/128]
        cols_k, kb, sizes_k, keep_k = tied("k", a[1], SCALE_BLOCK)
        cols_n, nb, sizes_n, keep_n = tied("n", b[1], SCALE_BLOCK)
        rule = f"{rows} {cols_k}, g {cols_n} {cols_k}, {rows} {kb}, g {kb} {nb}, {group_sizes} -> {rows} {cols_n}"
        keep = ("r", *keep_k, *keep_n)
        return rule, rule_options(
            rule, reduction=("k", "kb", "kt"), replication=keep, sizes={**size_of, **sizes_k, **sizes_n}
        )
    # ragged_k: a [K', rows], b [N', rows]; blockwise scales [rows/128, K'] and [rows/128, N'], or MX layouts
    if mx:  # each block's scales one flat layout of the block's rows
        flat_a, s_a = term(("s", blocks), ("sa", scale_a[0] // blocks))
        flat_b, s_b = term(("s", blocks), ("sb", scale_b[0] // blocks))
        rule = f"i {rows}, j {rows}, {flat_a}, {flat_b}, {group_sizes} -> g i j"
        keep, extra = ("r", "i", "j", "sa", "sb"), {**s_a, **s_b}
    else:
        tiles, extra = term(("s", blocks), ("t", a[1] // blocks // SCALE_BLOCK))
        rule = f"i {rows}, j {rows}, {tiles} i, {tiles} j, {group_sizes} -> g i j"
        keep = ("r", "t")
    return rule, rule_options(rule, reduction=("s",), replication=keep, sizes={**size_of, **extra})


def _partition(problem, out_dtype, plan, mesh, arg_shapes, result_shape):
    a, b, scale_a, _, sizes = arg_shapes
    blocked, mx = len(sizes.shape) == 2, mx_scales.is_mx_scale(scale_a)
    on_a, on_b = dim_axes(a), dim_axes(b)
    blocks = (dim_axes(sizes)[0] or (on_a[0] if problem == "ragged_m" else on_a[1])) if blocked else ()
    extents = {"s": sizes.shape[0] if blocked else 1}
    candidates = [("s", blocks)]
    if problem == "ragged_m":
        names = {"a": ("s", "k"), "b": ("g", "n", "k"), "scale_a": ("s",) if mx else ("s", "k")}
        names.update(scale_b=("g",) if mx else ("g", "k", "n"), out=("s", "n"))
        if not mx:  # N along whole scale blocks, K too, both operands agreeing on K
            n, k = b.shape[1], a.shape[1]
            extents.update(n=n // SCALE_BLOCK if n % SCALE_BLOCK == 0 else 1, k=k // SCALE_BLOCK)
            candidates += [("n", on_b[1]), ("k", on_a[1] if on_a[1] == on_b[2] else ())]
        summed = "k"
    else:
        names = {"a": ("i", "s"), "b": ("j", "s"), "scale_a": ("s",) if mx else ("s", "i")}
        names.update(scale_b=("s",) if mx else ("s", "j"), out=("g", "i", "j"))
        if not mx:  # each column has its own scales
            extents.update(i=a.shape[0], j=b.shape[0])
            candidates += [("i", on_a[0]), ("j", on_b[0])]
        summed = "s"
    chosen = choose_axes(mesh, candidates, extents)
    out_dtype = np.dtype(out_dtype)
    split_sum = chosen.get(summed, ())

    def per_shard(a, b, scale_a, scale_b, group_sizes):
        def call_for(dtype):
            return _block_call(a, b, scale_a, group_sizes, problem, dtype)

        if not split_sum:
            return _by_block(
                a, b, scale_a, scale_b, group_sizes, problem, out_dtype, plans.for_shard(plan, call_for(out_dtype))
            )
        # partials over K (ragged_m) or the blocks' rows (ragged_k), added in float32
        p, partial_dtype = plans.for_partials(plan, call_for, out_dtype)
        out = _by_block(a, b, scale_a, scale_b, group_sizes, problem, partial_dtype, p).astype(np.float32)
        return lax.psum(out, split_sum).astype(out_dtype)

    names["sizes"] = ("s", "g") if blocked else ("g",)
    order = ("a", "b", "scale_a", "scale_b", "sizes")
    shardings = tuple(NamedSharding(mesh, spec_of(names[o], chosen)) for o in order)
    return mesh, per_shard, NamedSharding(mesh, spec_of(names["out"], chosen)), shardings


def _block_call(a, b, scale_a, group_sizes, problem, out_dtype) -> Call:
    """The Call of one row block of a grouped call on these (local) operands."""
    blocks, groups = (group_sizes.shape[0] if group_sizes.ndim == 2 else 1), group_sizes.shape[-1]
    if problem == "ragged_m":
        return scaled_ragged_call(
            a.shape[0] // blocks, b.shape[1], a.shape[1], groups, a.dtype, out_dtype, mx_scales.is_mx_scale(scale_a)
        )
    return scaled_ragged_k_call(
        a.shape[0], b.shape[0], a.shape[1] // blocks, groups, a.dtype, out_dtype, mx_scales.is_mx_scale(scale_a)
    )


scaled_ragged_p = partitioned_primitive(
    "jax_cluster_scaled_ragged_dot",
    static=("problem", "out_dtype", "plan"),
    abstract_eval=_abstract_eval,
    whole=_whole,
    partition=_partition,
    sharding_rule=_sharding_rule,
    batch_rule="loop",
)


def scaled_ragged_dot(
    a, b, scale_a, scale_b, group_sizes, *, out_dtype=jnp.bfloat16, plan: Plan | None = None, device=None
):
    """Binds the block-scaled grouped GEMM (ragged_m) with `plan`, made for
    one row block, or with a fresh plan (the planner's kernel row, or the
    float32 fallback with the same semantics)."""
    _check(a, b, scale_a, scale_b, group_sizes, out_dtype)
    out_dtype = np.dtype(out_dtype)
    plan = plans.choose(_block_call(a, b, scale_a, group_sizes, "ragged_m", out_dtype), plan, device, _WHO)
    return scaled_ragged_p.bind(a, b, scale_a, scale_b, group_sizes, problem="ragged_m", out_dtype=out_dtype, plan=plan)


def scaled_ragged_k_call(m: int, n: int, rows: int, groups: int, dtype, out_dtype, mx: bool = False) -> Call:
    """The Call of a block-scaled weight gradient (ragged_k; A [K', rows] and
    B [N', rows], both K-major in the GEMM view (m, n, k) = (K', N', rows));
    `mx`: MXFP8 scales."""
    name = MX_DTYPE if mx else dtype_name(dtype)
    return Call("ragged_k", m, n, rows, groups, "k", "k", name, dtype_name(out_dtype))


def scaled_ragged_k_dot(
    a, b, scale_a, scale_b, group_sizes, *, out_dtype=jnp.bfloat16, plan: Plan | None = None, device=None
):
    """Binds the block-scaled weight-gradient GEMM (ragged_k) with `plan`,
    made for one row block, or with a fresh plan (the planner's kernel row,
    or the float32 fallback with the same semantics)."""
    _check_ragged_k(a, b, scale_a, scale_b, group_sizes, out_dtype)
    out_dtype = np.dtype(out_dtype)
    plan = plans.choose(_block_call(a, b, scale_a, group_sizes, "ragged_k", out_dtype), plan, device, _WHO)
    return scaled_ragged_p.bind(a, b, scale_a, scale_b, group_sizes, problem="ragged_k", out_dtype=out_dtype, plan=plan)
