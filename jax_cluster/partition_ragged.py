"""How ragged_dot_p splits over a mesh.

Group sizes of shape [S, G] say that the M rows are S equal blocks, block s
holding its own G consecutive groups (group_sizes[s]). Sharding S (and the
rows with it) gives each device whole blocks with their own sizes: data
parallelism. 1-D sizes [G] describe one block, whose rows stay whole.
  ragged_m (lhs [M,K], rhs [G,K,N] or [G,N,K]): rows split -> local grouped
    GEMMs, output rows split alike; N split on rhs -> output columns split;
    K split on both -> fp32 partials, then a psum.
  ragged_k (the weight gradient, [M,K'] x [M,N'] -> [G,K',N']): K' and N'
    split -> output split alike; rows split -> fp32 partials, then a psum.
Each shard is planned for its own local problem (one row block).
"""
from __future__ import annotations

import numpy as np
from jax import lax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding

from jax_cluster.local_primitives import gemm_view, ragged_local_p
from jax_cluster.partition_specs import choose_axes, dim_axes, spec_of
from jax_cluster.plan import Plan, dtype_name
from jax_cluster.ragged_plan import plan_ragged


def local_plan(plan: Plan, a, b, group_sizes, problem, b_major, out_dtype) -> Plan:
    """The plan of one shard's row block: the given one when that is the
    problem it was made for, else a fresh plan on the same device."""
    blocks = group_sizes.shape[0] if group_sizes.ndim == 2 else 1
    m, n, k = gemm_view(a.shape, b.shape, problem, b_major, blocks)
    if (plan.m, plan.n, plan.k, plan.out_dtype) == (m, n, k, dtype_name(out_dtype)):
        return plan
    return plan_ragged(m, n, k, plan.groups, problem=problem, dtype=a.dtype, out_dtype=out_dtype,
                       b_major=b_major, a_major=plan.a_major, device=plan.device)


def blockwise(a, b, group_sizes, problem, b_major, out_dtype, plan):
    """One grouped call per row block; ragged_k sums the blocks' fp32 partials."""
    out_dtype = np.dtype(out_dtype)
    if group_sizes.ndim == 1:
        return ragged_local_p.bind(a, b, group_sizes, problem=problem, b_major=b_major,
                                   out_dtype=out_dtype, plan=plan)
    blocks = group_sizes.shape[0]
    rows = a.shape[0] // blocks
    if problem == "ragged_m":
        outs = [ragged_local_p.bind(a[s * rows:(s + 1) * rows], b, group_sizes[s],
                                    problem=problem, b_major=b_major, out_dtype=out_dtype,
                                    plan=plan) for s in range(blocks)]
        return lax.concatenate(outs, 0) if blocks > 1 else outs[0]
    partial_dtype = np.dtype(np.float32) if blocks > 1 else out_dtype
    p = local_plan(plan, a, b, group_sizes, problem, b_major, partial_dtype)
    total = None
    for s in range(blocks):
        part = ragged_local_p.bind(a[s * rows:(s + 1) * rows], b[s * rows:(s + 1) * rows],
                                   group_sizes[s], problem=problem, b_major=b_major,
                                   out_dtype=partial_dtype, plan=p)
        total = part if total is None else total + part
    return total.astype(out_dtype)


sharded_ragged = custom_partitioning(blockwise, static_argnums=(3, 4, 5, 6))


def _factors(problem, b_major, blocked):
    """Factor names of lhs, rhs, group_sizes and the output; "s" is the row
    block (S), "r" a row within a block, "m" the rows of a single block."""
    rows = "s" if blocked else "m"
    sizes = ("s", "g") if blocked else ("g",)
    if problem == "ragged_k":
        return (rows, "i"), (rows, "j"), sizes, ("g", "i", "j")
    rhs = ("g", "k", "n") if b_major == "n" else ("g", "n", "k")
    return (rows, "k"), rhs, sizes, (rows, "n")


def _sharding_rule(problem, b_major, out_dtype, plan, mesh, operand_types, result_types):
    a_shape, _, sizes_shape = (tuple(t.shape) for t in operand_types)
    blocked = len(sizes_shape) == 2
    fa, fb, fs, fo = _factors(problem, b_major, blocked)
    # the rows of lhs, rhs (ragged_k) and output (ragged_m) are S blocks of R rows
    dims = lambda names: " ".join("(s r)" if f == "s" else f for f in names)  # noqa: E731
    rule = f"{dims(fa)}, {dims(fb)}, {' '.join(fs)} -> {dims(fo)}"
    if problem == "ragged_k":
        options = {"reduction_factors": ("s",) if blocked else ()}
    else:
        options = {"reduction_factors": ("k",)}
    if blocked:  # a block is never split: its groups are one sorted run
        options.update(need_replication_factors=("r",), r=a_shape[0] // sizes_shape[0])
    else:
        options.update(need_replication_factors=("m",))
    return rule, options


def _partition(problem, b_major, out_dtype, plan, mesh, arg_shapes, result_shape):
    a, b, sizes = arg_shapes
    blocked = len(sizes.shape) == 2
    fa, fb, fs, fo = _factors(problem, b_major, blocked)
    on_a, on_b = dict(zip(fa, dim_axes(a))), dict(zip(fb, dim_axes(b)))
    extents = {**dict(zip(fb, b.shape)), **dict(zip(fa, a.shape)), **dict(zip(fs, sizes.shape))}
    blocks = (dim_axes(sizes)[0] or on_a["s"]) if blocked else ()
    if problem == "ragged_k":
        candidates = [("s", blocks), ("i", on_a["i"]), ("j", on_b["j"])]
        summed = "s"
    else:
        k_axes = on_a["k"] if on_a["k"] == on_b["k"] else ()
        candidates = [("s", blocks), ("n", on_b["n"]), ("k", k_axes)]
        summed = "k"
    chosen = choose_axes(mesh, candidates, extents)
    out_dtype = np.dtype(out_dtype)
    split_sum = chosen[summed]

    def per_shard(a, b, group_sizes):
        if not split_sum:
            p = local_plan(plan, a, b, group_sizes, problem, b_major, out_dtype)
            return blockwise(a, b, group_sizes, problem, b_major, out_dtype, p)
        p = local_plan(plan, a, b, group_sizes, problem, b_major, np.float32)
        partial = blockwise(a, b, group_sizes, problem, b_major, np.float32, p)
        return lax.psum(partial, split_sum).astype(out_dtype)

    shardings = tuple(NamedSharding(mesh, spec_of(f, chosen)) for f in (fa, fb, fs))
    return mesh, per_shard, NamedSharding(mesh, spec_of(fo, chosen)), shardings


sharded_ragged.def_partition(partition=_partition, sharding_rule=_sharding_rule)
