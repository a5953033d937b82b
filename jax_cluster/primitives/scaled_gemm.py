"""The block-scaled fp8 GEMM: D = (A x its scales) . (B x its scales)^T,
DeepSeek-V3's blockwise recipe on CUTLASS's blockwise-scaled mainloop.

  a        [M, K]  fp8 values, read K-major (fp8 wgmma reads no other layout)
  b        [N, K]  fp8 values, K-major
  scale_a  [K/128, M]           float32: A's 1 x 128 tiles along K
  scale_b  [K/128, ceil(N/128)] float32: B's 128 x 128 blocks

Both scale arrays run over K blocks first (the layout the mainloop reads);
K is a multiple of 128. The kernel scales each K block's fp32 partial sums
before adding them to the accumulators, and writes bfloat16.

MXFP8 (sm100f): the same call with e8m0 scales names the MX format, one
scale per 32 values along K of A and of B, each flat in the kernel's layout
(primitives/mx_scales.py): scale_a [mx_scales.layout_size(M, K)], scale_b
[mx_scales.layout_size(N, K)]; K a multiple of 128.

Over a mesh each shard runs its own block-scaled GEMM, planned for its local
shape, and takes its operands' slices with their scales:
  M split -> a's rows and scale_a's columns; N split -> b's rows and
    scale_b's columns (N/shards a multiple of 128, so no scale block is cut);
  K split (blockwise only, K/shards a multiple of 128) -> float32 partials,
    then a psum.
MX scales split with M and N along whole 128-row tiles of their layout (M or
N a multiple of 128 times the shards), never along K. Whatever does not
divide that way is gathered. vmap runs a loop over the mapped axis. The op is
not differentiable: the fp8 training recipe (ops/fp8_training.py) quantizes
each product's operands itself.
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
from jax_cluster.primitives import plans
from jax_cluster.primitives.lowering import scaled_gemm_local_p
from jax_cluster.primitives.mx_scales import ROWS_PER_ATOM, SCALE_DTYPE, is_mx_scale, layout_size
from jax_cluster.primitives.operands import check_scaled_operands
from jax_cluster.primitives.registry import partitioned_primitive
from jax_cluster.primitives.specs import choose_axes, dim_axes, rule_options, spec_of, term, tied

_WHO = "jax_cluster scaled_gemm"


def _check(a, b, scale_a, scale_b, out_dtype) -> tuple[int, int, int]:
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"{_WHO}: a must be [M, K] and b [N, K], got shapes {a.shape} and {b.shape}")
    (m, k), (n, kb) = a.shape, b.shape
    if k != kb:
        raise ValueError(f"{_WHO}: contracting dimensions differ: a {a.shape} has K={k}, b {b.shape} has K={kb}")
    if is_mx_scale(scale_a):
        if k % SCALE_BLOCK:  # the MX kernel's K tile
            raise ValueError(f"{_WHO}: MX operands need K a multiple of {SCALE_BLOCK}, got K = {k}")
        scales = (("scale_a", scale_a, (layout_size(m, k),)), ("scale_b", scale_b, (layout_size(n, k),)))
        check_scaled_operands(_WHO, a, b, k, out_dtype, scales, block=MX_SCALE_BLOCK, scale_dtype=SCALE_DTYPE)
        return m, n, k
    blocks = k // SCALE_BLOCK
    check_scaled_operands(
        _WHO,
        a,
        b,
        k,
        out_dtype,
        (("scale_a", scale_a, (blocks, m)), ("scale_b", scale_b, (blocks, -(-n // SCALE_BLOCK)))),
    )
    return m, n, k


def scaled_gemm_call(m: int, n: int, k: int, dtype, out_dtype, mx: bool = False) -> Call:
    """The Call of a block-scaled GEMM (A and B K-major); `mx`: MXFP8 scales."""
    name = MX_DTYPE if mx else dtype_name(dtype)
    return Call("dense", m, n, k, 1, "k", "k", name, dtype_name(out_dtype))


def _abstract_eval(a, b, scale_a, scale_b, *, out_dtype, plan):
    m, n, _ = _check(a, b, scale_a, scale_b, out_dtype)
    return jax.core.ShapedArray((m, n), out_dtype)


# --------------------------------------------------------------------------- partitioning


def _whole(a, b, scale_a, scale_b, out_dtype, plan):
    return scaled_gemm_local_p.bind(a, b, scale_a, scale_b, out_dtype=out_dtype, plan=plan)


def _tiles(rows: int) -> int:
    """How many whole 128-row tiles (scale blocks, or MX layout tiles) split
    `rows` evenly: a split must cut between them; 1 when none does."""
    return rows // SCALE_BLOCK if rows % SCALE_BLOCK == 0 else 1


def _sharding_rule(out_dtype, plan, mesh, operand_types, result_types):
    (m, k), (n, _) = operand_types[0].shape, operand_types[1].shape
    if len(operand_types[2].shape) == 1:  # MX: one flat layout per operand, 128-row tiles outermost
        per_tile = layout_size(ROWS_PER_ATOM, k)  # the layout's bytes per 128 rows
        terms, sizes = [], {}
        for name, rows in (("m", m), ("n", n)):
            if rows % ROWS_PER_ATOM == 0:  # values and scales split along whole tiles
                values, s_values = term((f"{name}b", rows // ROWS_PER_ATOM), (f"{name}t", ROWS_PER_ATOM))
                scales, s_scales = term((f"{name}b", rows // ROWS_PER_ATOM), (f"{name}a", per_tile))
                terms.append((values, scales))
                sizes.update(s_values, **s_scales)
            else:
                terms.append((name, f"{name}s"))
        (rows_m, scale_a), (rows_n, scale_b) = terms
        rule = f"{rows_m} k, {rows_n} k, {scale_a}, {scale_b} -> {rows_m} {rows_n}"
        return rule, rule_options(rule, replication=("k", "ms", "ns"), sizes=sizes)
    # blockwise: scale_a [K/128, M], scale_b [K/128, N/128]
    cols_k, kb, sizes_k, keep_k = tied("k", k, SCALE_BLOCK)
    rows_n, nb, sizes_n, keep_n = tied("n", n, SCALE_BLOCK)
    rule = f"m {cols_k}, {rows_n} {cols_k}, {kb} m, {kb} {nb} -> m {rows_n}"
    reduced = ("k", "kb", "kt")  # whichever of them the rule has
    return rule, rule_options(rule, reduction=reduced, replication=keep_k + keep_n, sizes={**sizes_k, **sizes_n})


def _partition(out_dtype, plan, mesh, arg_shapes, result_shape):
    a, b, scale_a, _ = arg_shapes
    (m, k), n = a.shape, b.shape[0]
    (on_m, on_ka), (on_n, on_kb) = dim_axes(a), dim_axes(b)
    mx = is_mx_scale(scale_a)
    # blockwise K splits along whole scale blocks when both operands agree on it; MX's never
    k_axes = on_ka if on_ka == on_kb and not mx else ()
    # blockwise scale_a has a column per row of a; MX scales come in 128-row tiles
    tiles = {"m": _tiles(m) if mx else m, "n": _tiles(n), "k": k // SCALE_BLOCK}
    chosen = choose_axes(mesh, [("m", on_m), ("n", on_n), ("k", k_axes)], tiles)
    out_dtype = np.dtype(out_dtype)
    k_split = chosen["k"]
    partial_dtype = np.dtype(np.float32) if k_split else out_dtype

    def per_shard(a, b, scale_a, scale_b):
        call = scaled_gemm_call(a.shape[0], b.shape[0], a.shape[1], a.dtype, partial_dtype, mx)
        out = scaled_gemm_local_p.bind(
            a, b, scale_a, scale_b, out_dtype=partial_dtype, plan=plans.for_shard(plan, call)
        )
        if k_split:  # float32 partial products over K, summed across its shards
            out = lax.psum(out, k_split).astype(out_dtype)
        return out

    scales = (("m",), ("n",)) if mx else (("k", "m"), ("k", "n"))
    specs = (("m", "k"), ("n", "k"), *scales)
    arg_shardings = tuple(NamedSharding(mesh, spec_of(f, chosen)) for f in specs)
    return mesh, per_shard, NamedSharding(mesh, spec_of(("m", "n"), chosen)), arg_shardings


scaled_gemm_p = partitioned_primitive(
    "jax_cluster_scaled_gemm",
    static=("out_dtype", "plan"),
    abstract_eval=_abstract_eval,
    whole=_whole,
    partition=_partition,
    sharding_rule=_sharding_rule,
    batch_rule="loop",
)


def scaled_gemm(a, b, scale_a, scale_b, *, out_dtype=jnp.bfloat16, plan: Plan | None = None, device=None):
    """Binds the block-scaled GEMM with `plan`, or with a fresh plan (the
    planner's kernel row, or the float32 fallback with the same semantics)."""
    m, n, k = _check(a, b, scale_a, scale_b, out_dtype)
    out_dtype = np.dtype(out_dtype)
    plan = plans.choose(scaled_gemm_call(m, n, k, a.dtype, out_dtype, is_mx_scale(scale_a)), plan, device, _WHO)
    return scaled_gemm_p.bind(a, b, scale_a, scale_b, out_dtype=out_dtype, plan=plan)
