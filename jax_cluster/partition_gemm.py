"""How gemm_p splits over a mesh: custom_partitioning with a Shardy rule.

The kernel is an opaque custom call to XLA, which would otherwise gather
every operand onto every device. Here each factor of the product keeps the
sharding its operands bring:
  batch, M, N sharded -> one local GEMM per shard, output sharded the same way;
  K sharded           -> local GEMMs into fp32 partials, then a psum.
Each shard is planned for its own local (m, n, k): a plan made for the global
shapes would pick the wrong tile and schedule, and the kernel checks them.
"""
from __future__ import annotations

import numpy as np
from jax import lax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding

from jax_cluster.local_primitives import gemm_dims, gemm_local_p
from jax_cluster.partition_specs import choose_axes, dim_axes, spec_of
from jax_cluster.plan import Plan, dtype_name, plan_gemm


def _factors(a_major, b_major, batched):
    """Factor names of A's, B's and the output's dimensions."""
    lead = ("b",) if batched else ()
    a = lead + (("m", "k") if a_major == "k" else ("k", "m"))
    b = lead + (("n", "k") if b_major == "k" else ("k", "n"))
    return a, b, lead + ("m", "n")


def local_plan(plan: Plan, a, b, a_major, b_major, out_dtype, epilogue="none") -> Plan:
    """The plan of one shard: the given one when the local problem is the one
    it was made for, else a fresh plan of the local shapes on the same device."""
    batch, m, n, k, _ = gemm_dims(a.shape, b.shape, a_major, b_major)
    nbatch = int(np.prod(batch)) if batch else 1
    if ((plan.m, plan.n, plan.k, plan.batch, plan.out_dtype, plan.epilogue)
            == (m, n, k, nbatch, dtype_name(out_dtype), epilogue)):
        return plan
    return plan_gemm(m, n, k, dtype=a.dtype, out_dtype=out_dtype, batch=nbatch,
                     a_major=a_major, b_major=b_major, device=plan.device, epilogue=epilogue)


def _whole(a, b, a_major, b_major, out_dtype, plan):
    """The unpartitioned call (one device, or everything replicated)."""
    return gemm_local_p.bind(a, b, a_major=a_major, b_major=b_major, out_dtype=out_dtype,
                             plan=plan)


sharded_gemm = custom_partitioning(_whole, static_argnums=(2, 3, 4, 5))


def _sharding_rule(a_major, b_major, out_dtype, plan, mesh, operand_types, result_types):
    fa, fb, fo = _factors(a_major, b_major, len(operand_types[0].shape) == 3)
    return f"{' '.join(fa)}, {' '.join(fb)} -> {' '.join(fo)}", {"reduction_factors": ("k",)}


def _partition(a_major, b_major, out_dtype, plan, mesh, arg_shapes, result_shape):
    a, b = arg_shapes
    fa, fb, fo = _factors(a_major, b_major, len(a.shape) == 3)
    on_a, on_b = dict(zip(fa, dim_axes(a))), dict(zip(fb, dim_axes(b)))
    sizes = {**dict(zip(fb, b.shape)), **dict(zip(fa, a.shape))}
    # K stays split only when both operands agree on it; else it is gathered
    k_axes = on_a["k"] if on_a["k"] == on_b["k"] else ()
    candidates = [("b", on_a.get("b") or on_b.get("b", ())), ("m", on_a["m"]),
                  ("n", on_b["n"]), ("k", k_axes)]
    chosen = choose_axes(mesh, candidates, sizes)
    out_dtype = np.dtype(out_dtype)
    k_split = chosen["k"]
    partial_dtype = np.dtype(np.float32) if k_split else out_dtype

    def per_shard(a, b):
        p = local_plan(plan, a, b, a_major, b_major, partial_dtype)
        out = gemm_local_p.bind(a, b, a_major=a_major, b_major=b_major, out_dtype=partial_dtype,
                                plan=p)
        if k_split:  # fp32 partial products over K, summed across its shards
            out = lax.psum(out, k_split).astype(out_dtype)
        return out

    arg_shardings = (NamedSharding(mesh, spec_of(fa, chosen)),
                     NamedSharding(mesh, spec_of(fb, chosen)))
    return mesh, per_shard, NamedSharding(mesh, spec_of(fo, chosen)), arg_shardings


sharded_gemm.def_partition(partition=_partition, sharding_rule=_sharding_rule)
