"""How ragged_dot_p splits over a mesh: data-parallel tokens.

Group sizes of shape [S, G] say that the M rows are S equal blocks, block s
holding its own G consecutive groups (group_sizes[s]). Sharding S (and M with
it) on some mesh axes gives each device whole blocks with their own sizes:
  ragged_m: local grouped GEMMs, output rows sharded like lhs; rhs replicated;
  ragged_k (the weight gradient): local fp32 partials [G,K',N'], then a psum.
1-D sizes [G] describe one block, which is not split. Each block is one call
planned for its own rows, so the plan of the global call holds per shard.
"""
from __future__ import annotations

import numpy as np
from jax import lax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from jax_cluster.local_primitives import ragged_local_p
from jax_cluster.partition_specs import choose_axes, dim_axes, spec_of
from jax_cluster.plan import Plan, dtype_name
from jax_cluster.ragged_plan import plan_ragged


def _with_out_dtype(plan: Plan, dtype, out_dtype) -> Plan:
    """The plan for fp32 partial sums where the call's own writes another dtype."""
    if plan.out_dtype == dtype_name(out_dtype):
        return plan
    return plan_ragged(plan.m, plan.n, plan.k, plan.groups, problem=plan.problem,
                       dtype=dtype, out_dtype=out_dtype, b_major=plan.b_major,
                       a_major=plan.a_major, device=plan.device)


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
    p = _with_out_dtype(plan, a.dtype, partial_dtype)
    total = None
    for s in range(blocks):
        part = ragged_local_p.bind(a[s * rows:(s + 1) * rows], b[s * rows:(s + 1) * rows],
                                   group_sizes[s], problem=problem, b_major=b_major,
                                   out_dtype=partial_dtype, plan=p)
        total = part if total is None else total + part
    return total.astype(out_dtype)


sharded_ragged = custom_partitioning(blockwise, static_argnums=(3, 4, 5, 6))


def _sharding_rule(problem, b_major, out_dtype, plan, mesh, operand_types, result_types):
    a_shape, _, sizes_shape = (tuple(t.shape) for t in operand_types)
    rhs = "g k n" if b_major == "n" else "g n k"
    if len(sizes_shape) == 1:  # one block: its rows cannot be split
        if problem == "ragged_m":
            return f"m k, {rhs}, g -> m n", {"need_replication_factors": ("m",)}
        return "m i, m j, g -> g i j", {"need_replication_factors": ("m",)}
    rows = a_shape[0] // sizes_shape[0]
    if problem == "ragged_m":
        return (f"(s r) k, {rhs}, s g -> (s r) n",
                {"need_replication_factors": ("r",), "r": rows})
    return ("(s r) i, (s r) j, s g -> g i j",
            {"reduction_factors": ("s",), "need_replication_factors": ("r",), "r": rows})


def _partition(problem, b_major, out_dtype, plan, mesh, arg_shapes, result_shape):
    a, b, sizes = arg_shapes
    if len(sizes.shape) == 2:
        s_axes = dim_axes(sizes)[0] or dim_axes(a)[0]
        chosen = choose_axes(mesh, [("s", s_axes)], {"s": sizes.shape[0]})
    else:
        chosen = {"s": ()}
    split = chosen["s"]
    rows = spec_of(("s", None), chosen)
    if problem == "ragged_m":
        shardings = (rows, PartitionSpec(), rows if len(sizes.shape) == 2 else PartitionSpec())
        out_spec = rows
    else:
        shardings = (rows, rows, rows if len(sizes.shape) == 2 else PartitionSpec())
        out_spec = PartitionSpec()
    out_dtype = np.dtype(out_dtype)

    def per_shard(a, b, group_sizes):
        if problem == "ragged_m" or not split:
            return blockwise(a, b, group_sizes, problem, b_major, out_dtype, plan)
        partial = blockwise(a, b, group_sizes, problem, b_major, np.float32,
                            _with_out_dtype(plan, a.dtype, np.float32))
        return lax.psum(partial, split).astype(out_dtype)

    return (mesh, per_shard, NamedSharding(mesh, out_spec),
            tuple(NamedSharding(mesh, s) for s in shardings))


sharded_ragged.def_partition(partition=_partition, sharding_rule=_sharding_rule)
