"""The dense planner: which compiled variant, schedule, raster and swizzle
run C[M,N] = A·B, or why XLA's dot does (see `Plan`)."""

from __future__ import annotations

import math

from jax_cluster.planning import cost_model, routing, tables
from jax_cluster.planning.call import Call
from jax_cluster.planning.candidates import (
    NO_RESIDENT_CANDIDATE,
    Candidate,
    best_candidate,
    call_base,
    check_overrides,
    kernel_plan,
    menu_rows,
    xla_plan,
)
from jax_cluster.planning.device import describe
from jax_cluster.planning.plan import Plan, dtype_name

OVERRIDABLE = (
    "variant",
    "tile",
    "cluster",
    "schedule",
    "splits",
    "raster",
    "swizzle",
    "allow_nonportable_cluster",
    "route",
)
# overrides that pin a kernel choice, and so skip the measured routing
PINNING = frozenset(OVERRIDABLE) - {"allow_nonportable_cluster", "route"}


def _schedules(v: tables.Variant, k: int, memory_bound: bool, overrides: dict):
    """(schedule, splits) pairs the planner scores for one row."""
    schedule = overrides.get("schedule", "split_k" if "splits" in overrides else None)
    if schedule is not None:  # menu_rows kept only variants that run it
        if schedule != "split_k":
            return [(schedule, int(overrides.get("splits", 1)))]  # the FFI rejects splits > 1
        return [(schedule, int(overrides.get("splits", 2)))] if "split_k" in v.schedules else []
    k_tiles = math.ceil(k / v.tile_k)
    out = [
        (s, 1)
        for s in v.schedules
        if s != "split_k" and (s != "stream_k" or k_tiles >= cost_model.STREAM_K_MIN_K_TILES)
    ]
    # split-K only where memory decides: there it spreads the weight stream over
    # more SMs with fewer partial tiles than stream-K (bench_planner, small M)
    if memory_bound and "split_k" in v.schedules and k_tiles >= cost_model.SPLIT_K_MIN_K_TILES:
        out += [("split_k", s) for s in cost_model.SPLIT_K_SPLITS]
    return out


def plan_gemm(
    m: int,
    n: int,
    k: int,
    *,
    dtype,
    out_dtype=None,
    batch: int = 1,
    a_major: str = "k",
    b_major: str = "n",
    device=None,
    epilogue: str = "none",
    **overrides,
) -> Plan:
    """Chooses among the compiled variants for C[M,N] = A·B (see `Plan`).

    `epilogue="bias_act"` plans for the fused bias/activation/C epilogue
    (`jax_cluster.linear`) and considers only rows that compile it.
    `overrides` pins choices: variant, tile=(m,n,k), cluster=(m,n), schedule,
    splits, raster, swizzle; or path="xla" to force the fallback. Unpinned
    GEMMs, fused epilogue included, go to XLA's dot where the measured routing
    rule expects it to be faster (`planning.routing`; XLA fuses the bias and
    activation itself); route="kernel" (or JAX_CLUSTER_ROUTE=kernel) skips
    that rule.
    """
    if epilogue not in tables.EPILOGUES:
        raise ValueError(f"plan(): epilogue must be one of {tables.EPILOGUES}, got {epilogue!r}")
    check_overrides(overrides, OVERRIDABLE, "plan()")
    route = overrides.pop("route", None) or routing.default_route()
    if route not in routing.ROUTES:
        raise ValueError(f"plan(): route must be one of {routing.ROUTES}, got {route!r}")
    dev = describe(device)
    out = dtype_name(out_dtype if out_dtype is not None else dtype)
    call = Call("dense", int(m), int(n), int(k), int(batch), a_major, b_major, dtype_name(dtype), out, epilogue)
    base = call_base(call, dev)

    rows, why = menu_rows(dev, call, overrides, "plan()")
    if why:
        return xla_plan(base, why)
    notes = []
    if not overrides.get("allow_nonportable_cluster", False):
        notes = [
            f"{v.name}: a {v.cluster_size}-CTA cluster is non-portable; pass "
            "allow_nonportable_cluster=True to consider it"
            for v in rows
            if v.cluster_size > cost_model.PORTABLE_CLUSTER_SIZE
        ]
        rows = [v for v in rows if v.cluster_size <= cost_model.PORTABLE_CLUSTER_SIZE]
    if not rows:
        return xla_plan(
            base, "every matching variant needs a non-portable cluster (> 8 CTAs) and the caller did not opt in", notes
        )
    floor = cost_model.memory_floor(m, n, k, batch, call.dtype, out, dev)

    def options(v: tables.Variant, clusters: int):
        raster, swizzle = cost_model.raster_and_swizzle(v, m, n, batch)
        raster = overrides.get("raster", raster)
        swizzle = int(overrides.get("swizzle", swizzle))
        row_memory_bound = cost_model.score(v, m, n, k, batch, clusters, "stream_k", swizzle)[0] < floor
        for schedule, splits in _schedules(v, k, row_memory_bound, overrides):
            time, waves, eff = cost_model.score(v, m, n, k, batch, clusters, schedule, swizzle, splits)
            memory = cost_model.memory_time(v, m, n, k, batch, clusters, schedule, swizzle, splits, floor, dev)
            total = max(time, memory)
            if total > time:  # memory-bound: the MMAs wait on HBM for the rest
                eff *= time / total
            fixed = cost_model.schedule_fixed_cost(schedule, k, dev, call.dtype)
            key = (total + fixed, time, schedule != "static")
            yield Candidate(key, schedule, waves, eff, splits, raster, swizzle, memory_bound=total > time)

    choice, resident_notes = best_candidate(rows, dev, options)
    notes += resident_notes
    if choice is None:
        return xla_plan(base, NO_RESIDENT_CANDIDATE, notes)
    v, c = choice.variant, choice.candidate
    # XLA's dot has no block-scaled form: the alternative is dequantizing (the op's fallback)
    if route == "measured" and call.dtype not in tables.BLOCK_SCALED_DTYPES and not PINNING & set(overrides):
        why_xla = routing.xla_is_faster(call, c.memory_bound, dev)
        if why_xla:
            return xla_plan(base, why_xla, notes)
    split = f" x{c.splits} splits" if c.schedule == "split_k" else ""
    bound = ", memory-bound" if c.memory_bound else ""
    reason = (
        f"{v.name} fits: {c.waves:.2f} waves of {choice.clusters} resident {v.cluster_m}x{v.cluster_n} "
        f"clusters, {c.schedule}{split} schedule{bound}, modelled efficiency {c.efficiency:.0%}"
    )
    return kernel_plan(base, choice, dev, reason, notes)
