"""gated_ragged_p: the grouped product whose epilogue gates, act(gate) * up.

ragged_m with rhs [G, K, 2H] (b_major "n") or [G, 2H, K] ("k") whose 2H
columns hold gate and up in alternating blocks of `tables.GATE_BLOCK`
columns, gate first (`interleave` lays them out): out [M, H] =
act(lhs_g @ gate_g) * (lhs_g @ up_g) for the rows of each group g, under
ragged_dot_p's group-size rule; rows past the last group are zero.

It is not linear, so it has no autodiff rules: `ops/gated.py` gives it a
custom VJP. Partitioning: whole row blocks ([S, G] sizes) per device, all
else replicated (a K split would sum gated partials; an N split could cut a
gate block from its up block).
"""

from __future__ import annotations

import jax
import numpy as np
from jax import lax
from jax.sharding import NamedSharding

from jax_cluster.planning.call import Call
from jax_cluster.planning.plan import Plan, dtype_name
from jax_cluster.planning.tables import ACTIVATIONS, GATE_BLOCK
from jax_cluster.primitives import plans
from jax_cluster.primitives.lowering import gated_local_p
from jax_cluster.primitives.operands import check_dtypes, gemm_view
from jax_cluster.primitives.registry import partitioned_primitive
from jax_cluster.primitives.specs import choose_axes, dim_axes, rule_options, spec_of, term

_WHO = "jax_cluster.gated_ragged_dot"


def check_activation(activation) -> str:
    if activation not in ACTIVATIONS:
        raise ValueError(f"{_WHO}: activation must be one of {tuple(ACTIVATIONS)}, got {activation!r}")
    return activation


def _check(a, b, group_sizes, b_major, out_dtype):
    """The output shape, or a clear error."""
    if b_major not in ("n", "k"):
        raise ValueError(f"{_WHO}: b_major must be 'n' or 'k', got {b_major!r}")
    if group_sizes.ndim not in (1, 2) or group_sizes.dtype != np.dtype(np.int32):
        raise TypeError(f"{_WHO}: group_sizes must be int32 [G] or [S, G], got {group_sizes.dtype}{group_sizes.shape}")
    check_dtypes(_WHO, out_dtype, lhs=a, rhs=b)
    if a.ndim != 2 or b.ndim != 3:
        raise ValueError(f"{_WHO}: lhs must be [M, K] and rhs [G, K, 2H] or [G, 2H, K], got {a.shape} and {b.shape}")
    kb, n = (b.shape[1], b.shape[2]) if b_major == "n" else (b.shape[2], b.shape[1])
    if a.shape[1] != kb:
        raise ValueError(f"{_WHO}: contracting dimensions differ: lhs has K={a.shape[1]}, rhs {b.shape} has K={kb}")
    if b.shape[0] != group_sizes.shape[-1]:
        raise ValueError(f"{_WHO}: rhs has {b.shape[0]} groups but group_sizes {group_sizes.shape[-1]}")
    if n % (2 * GATE_BLOCK):
        raise ValueError(
            f"{_WHO}: rhs's {n} columns must be gate and up blocks of {GATE_BLOCK} (a multiple of {2 * GATE_BLOCK})"
        )
    blocks = group_sizes.shape[0] if group_sizes.ndim == 2 else 1
    if blocks == 0 or a.shape[0] % blocks:
        raise ValueError(f"{_WHO}: {a.shape[0]} rows do not split into {blocks} row blocks")
    return a.shape[0], n // 2


def gated_call(a_shape, b_shape, sizes_shape, b_major, dtype, out_dtype) -> Call:
    """The Call of one row block: the GEMM view has all 2H columns."""
    blocks = sizes_shape[0] if len(sizes_shape) == 2 else 1
    m, n, k = gemm_view(a_shape, b_shape, "ragged_m", b_major, blocks)
    return Call("ragged_m", m, n, k, sizes_shape[-1], "k", b_major, dtype_name(dtype), dtype_name(out_dtype), "gated")


def _abstract_eval(a, b, group_sizes, *, b_major, activation, out_dtype, plan):
    return jax.core.ShapedArray(_check(a, b, group_sizes, b_major, out_dtype), out_dtype)


def _blockwise(a, b, group_sizes, b_major, activation, out_dtype, plan):
    params = dict(b_major=b_major, activation=activation, out_dtype=np.dtype(out_dtype))
    if group_sizes.ndim == 1:
        return gated_local_p.bind(a, b, group_sizes, plan=plan, **params)
    blocks = group_sizes.shape[0]
    rows = a.shape[0] // blocks  # the plan is one block's: every block is the same call
    outs = [
        gated_local_p.bind(a[s * rows : (s + 1) * rows], b, group_sizes[s], plan=plan, **params) for s in range(blocks)
    ]
    return lax.concatenate(outs, 0) if blocks > 1 else outs[0]


def _sharding_rule(b_major, activation, out_dtype, plan, mesh, operand_types, result_types):
    a_shape, _, sizes_shape = (tuple(t.shape) for t in operand_types)
    rhs = "g k n" if b_major == "n" else "g n k"
    if len(sizes_shape) == 2:  # whole row blocks move; nothing else is split
        rows, size_of = term(("s", sizes_shape[0]), ("r", a_shape[0] // sizes_shape[0]))
        rule = f"{rows} k, {rhs}, s g -> {rows} h"
        return rule, rule_options(rule, replication=("r", "k", "n", "h"), sizes=size_of)
    return f"m k, {rhs}, g -> m h", dict(need_replication_factors=("m", "k", "n", "h"))


def _partition(b_major, activation, out_dtype, plan, mesh, arg_shapes, result_shape):
    a, b, sizes = arg_shapes
    blocked = sizes.ndim == 2
    blocks = (dim_axes(sizes)[0] or dim_axes(a)[0]) if blocked else ()
    chosen = choose_axes(mesh, [("s", blocks)], {"s": sizes.shape[0] if blocked else 1})
    rows = ("s",) if blocked else ("m",)

    def per_shard(a, b, group_sizes):
        call = gated_call(a.shape, b.shape, group_sizes.shape, b_major, a.dtype, out_dtype)
        return _blockwise(a, b, group_sizes, b_major, activation, out_dtype, plans.for_shard(plan, call))

    lhs, out = NamedSharding(mesh, spec_of((*rows, "k"), chosen)), NamedSharding(mesh, spec_of((*rows, "h"), chosen))
    sizes_spec = NamedSharding(mesh, spec_of(("s", "g") if blocked else ("g",), chosen))
    return mesh, per_shard, out, (lhs, NamedSharding(mesh, spec_of(("g", "k", "n"), chosen)), sizes_spec)


gated_ragged_p = partitioned_primitive(
    "jax_cluster_gated_ragged_dot",
    static=("b_major", "activation", "out_dtype", "plan"),
    abstract_eval=_abstract_eval,
    whole=_blockwise,
    partition=_partition,
    sharding_rule=_sharding_rule,
    batch_rule="loop",
)


def gated(a, b, group_sizes, *, b_major="n", activation="silu", out_dtype=None, plan: Plan | None = None, device=None):
    """Binds gated_ragged_p with `plan`, or with a fresh plan when none is given."""
    out_dtype = np.dtype(out_dtype if out_dtype is not None else a.dtype)
    check_activation(activation)
    _check(a, b, group_sizes, b_major, out_dtype)
    call = gated_call(a.shape, b.shape, group_sizes.shape, b_major, a.dtype, out_dtype)
    plan = plans.choose(call, plan, device, _WHO)
    return gated_ragged_p.bind(
        a, b, group_sizes, b_major=b_major, activation=activation, out_dtype=out_dtype, plan=plan
    )
