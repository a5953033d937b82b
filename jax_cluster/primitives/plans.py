"""The plan a bound call runs: the one given, if it fits the call, else a
fresh one: the autotune cache's entry when reading it is on, else the
planner's. Binders and partition rules all go through here, so every one of
them checks a plan against its call the same way (`planning.call.fits`).
"""

from __future__ import annotations

import numpy as np

from jax_cluster.planning import autotune_cache
from jax_cluster.planning.call import Call, fits
from jax_cluster.planning.dense import plan_gemm
from jax_cluster.planning.device import describe
from jax_cluster.planning.grouped import plan_ragged
from jax_cluster.planning.plan import Plan


def fresh(call: Call, device) -> Plan:
    """A new plan for `call` on `device` (a jax Device or a DeviceInfo)."""
    if call.problem != "dense":
        return plan_ragged(
            call.m,
            call.n,
            call.k,
            call.count,
            problem=call.problem,
            dtype=call.dtype,
            out_dtype=call.out_dtype,
            b_major=call.b_major,
            a_major=call.a_major,
            epilogue=call.epilogue,
            device=device,
        )
    args = dict(
        dtype=call.dtype, out_dtype=call.out_dtype, batch=call.count, a_major=call.a_major, b_major=call.b_major
    )
    if call.epilogue == "none":
        tuned = autotune_cache.plan_from_cache(call.m, call.n, call.k, **args, device_info=describe(device))
        if tuned is not None:
            return tuned
    return plan_gemm(call.m, call.n, call.k, **args, device=device, epilogue=call.epilogue)


def choose(call: Call, plan: Plan | None, device, who: str) -> Plan:
    """`plan` when it fits `call` (a ValueError naming the difference when it
    does not), or a fresh plan when none is given."""
    if plan is None:
        return fresh(call, device)
    why = fits(plan, call)
    if why:
        raise ValueError(f"{who}: {why}")
    return plan


def for_shard(plan: Plan, call: Call) -> Plan:
    """The plan of one shard: the given one when the local call is the one it
    was made for, else a fresh plan of the local call on the same device."""
    return plan if not fits(plan, call) else fresh(call, plan.device)


def for_partials(plan: Plan, call_for, out_dtype) -> tuple[Plan, np.dtype]:
    """The plan and output dtype of partial products that the caller sums
    (row blocks, or the shards of a split contraction). `call_for(dtype)` is
    the Call of one partial written in `dtype`. float32 where a kernel writes
    it; else `out_dtype` where a kernel writes that (the grouped kernels
    write their input dtype only), the caller adding those in float32; else
    float32 on XLA's path."""
    f32 = np.dtype(np.float32)
    wide = for_shard(plan, call_for(f32))
    if wide.uses_kernel or np.dtype(out_dtype) == f32:
        return wide, f32
    own = for_shard(plan, call_for(np.dtype(out_dtype)))
    return (own, np.dtype(out_dtype)) if own.uses_kernel else (wide, f32)
