"""The planner for grouped GEMMs (ragged_dot): which compiled grouped variant
runs a ragged problem, or why XLA's ragged_dot does.

A ragged plan describes its GEMM view (m, n, k) plus the group count:
  ragged_m  out[M,N]: the rows of A [M,K] fall into groups, group g times B[g]
            (ragged_dot forward and d_lhs): (m, n, k) = (M, N, K).
  ragged_k  out[G,K',N'] = A_g^T B_g over the rows of group g (d_rhs), A stored
            [M,K'] and B [M,N']: (m, n, k) = (K', N', M).
Group sizes live on the device, so the model assumes evenly filled groups.
A ragged_m call whose weights (those of the groups that can receive rows)
take longer to stream than its MMAs is memory-bound: its time is the stream,
at the rate the CTAs a variant keeps busy can pull (cost_model.cta_pull_rate):
a narrow decode tile (cost_model.DECODE_TILE_N_MAX, memory-bound calls only
unless pinned) puts more CTAs on few groups' weights, each with fewer bytes
in flight. Where the groups hold at most cost_model.DECODE_MAX_ROWS_PER_GROUP
rows on average under uniform routing, the CUDA-core decode rows take the
call instead (the cluster size from cost_model.decode_seconds), and no row
of theirs takes any other call unless pinned.
"""

from __future__ import annotations

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

RAGGED_PROBLEMS = ("ragged_m", "ragged_k")
DEFAULT_A_MAJOR = {"ragged_m": "k", "ragged_k": "m"}
OVERRIDABLE = ("variant", "tile", "cluster", "route")
PINNING = frozenset(OVERRIDABLE) - {"route"}


def _schedule(v: tables.Variant) -> str:
    """A grouped kind runs one schedule: sm90's work queue, sm100's CLC."""
    (schedule,) = v.schedules
    return schedule


def plan_ragged(
    m: int,
    n: int,
    k: int,
    groups: int,
    *,
    problem: str,
    dtype,
    out_dtype=None,
    b_major: str = "n",
    a_major: str | None = None,
    epilogue: str = "none",
    device=None,
    **overrides,
) -> Plan:
    """Chooses among the compiled grouped variants for one ragged problem.

    (m, n, k) is the GEMM view described in this module's docstring; `groups`
    is G. `overrides` pins variant, tile=(m,n,k) or cluster=(m,n); path="xla"
    forces the fallback. Grouped kernels schedule dynamically: sm90a through a
    work queue ("dynamic"), sm100f through Cluster Launch Control ("clc").
    Unpinned calls small enough that XLA's ragged_dot measured faster run on
    XLA's path (routing.py); route="kernel" (or JAX_CLUSTER_ROUTE=kernel)
    keeps the kernel. `epilogue="gated"` (ragged_m) plans the gated
    product of `jax_cluster.gated_ragged_dot`: n counts gate and up columns.
    """
    if problem not in RAGGED_PROBLEMS:
        raise ValueError(f"plan_ragged(): problem must be one of {RAGGED_PROBLEMS}, got {problem!r}")
    check_overrides(overrides, OVERRIDABLE, "plan_ragged()")
    route = overrides.pop("route", None) or routing.default_route()
    if route not in routing.ROUTES:
        raise ValueError(f"plan_ragged(): route must be one of {routing.ROUTES}, got {route!r}")
    if epilogue not in ("none", "gated") or (epilogue == "gated" and problem != "ragged_m"):
        raise ValueError(f"plan_ragged(): epilogue must be 'none', or 'gated' for ragged_m; got {epilogue!r}")
    a_major = a_major or DEFAULT_A_MAJOR[problem]
    dev = describe(device)
    out = dtype_name(out_dtype if out_dtype is not None else dtype)
    call = Call(problem, int(m), int(n), int(k), int(groups), a_major, b_major, dtype_name(dtype), out, epilogue)
    base = call_base(call, dev)
    if epilogue == "gated" and n % (2 * tables.GATE_BLOCK):
        return xla_plan(base, f"N = {n} is not whole gate and up blocks of {tables.GATE_BLOCK} columns")

    # group g's rows start at a multiple of the row pitch, so TMA's rule covers every group
    rows, why = menu_rows(dev, call, overrides, "plan_ragged()")
    if why:
        return xla_plan(base, why)
    if route == "measured" and call.dtype not in tables.BLOCK_SCALED_DTYPES and not PINNING & set(overrides):
        why = routing.xla_ragged_is_faster(call, dev)
        if why:
            return xla_plan(base, why)
    if groups > tables.DECODE_MAX_GROUPS:  # a decode CTA keeps every group's rows in shared memory
        decode = [v.name for v in rows if v.kind == "decode"]
        rows = [v for v in rows if v.kind != "decode"]
        if not rows:
            return xla_plan(base, f"{decode[0]} takes at most {tables.DECODE_MAX_GROUPS} groups, not {groups}")

    memory_bound = problem == "ragged_m" and cost_model.grouped_memory_bound(m, n, k, groups, call.dtype, out, dev)
    pinned = "variant" in overrides or "tile" in overrides
    if not memory_bound and not pinned:
        rows = [v for v in rows if v.tile_n > cost_model.DECODE_TILE_N_MAX and v.kind != "decode"]
    decode_note = []
    if not pinned and any(v.kind == "decode" for v in rows):
        # the decode rows take the call, or none of them does (their measured rule)
        takes = cost_model.decode_takes(m, groups)
        rows = [v for v in rows if (v.kind == "decode") == takes]
        decode_note = [
            f"{cost_model.expected_rows_per_group(m, groups):.1f} rows per group if the routing is uniform: "
            + ("at most" if takes else "more than")
            + f" {cost_model.DECODE_MAX_ROWS_PER_GROUP:g}, so the "
            + ("CUDA-core decode rows run it" if takes else "grouped GEMM's tensor cores run it, not the decode rows")
        ]

    if not rows:  # every ranked row is a narrow or decode row, and the call is not theirs
        return xla_plan(
            base,
            "the ranked rows for this call serve decode-size calls only (narrow tiles: memory-bound calls; "
            f"CUDA-core decode rows: at most {cost_model.DECODE_MAX_ROWS_PER_GROUP:g} rows per group)",
            decode_note,
        )

    def options(v: tables.Variant, clusters: int):
        if v.kind == "decode":
            yield _decode_candidate(v, m, n, k, groups, clusters, call, dev, memory_bound)
            return
        time, waves, eff = cost_model.grouped_score(v, m, n, k, groups, problem, clusters, _schedule(v))
        if memory_bound:  # the weight stream, at the rate the CTAs this variant keeps busy can pull
            memory = cost_model.grouped_memory_time(v, m, n, k, groups, clusters, call.dtype, out, dev)
            eff *= time / max(time, memory)
            time = max(time, memory)
        yield Candidate((time,), _schedule(v), waves, eff, raster="along_m", memory_bound=memory_bound)

    choice, notes = best_candidate(rows, dev, options)
    if choice is None:
        return xla_plan(base, NO_RESIDENT_CANDIDATE, notes)
    notes += decode_note
    notes.append("waves and efficiency are modelled for evenly filled groups; the sizes are only known on the device")
    v, c = choice.variant, choice.candidate
    bound = ", memory-bound (the non-empty groups' weights)" if memory_bound else ""
    reason = (
        f"{v.name} fits: {groups} groups over {choice.clusters} resident {v.cluster_m}x{v.cluster_n} "
        f"clusters, {c.schedule} schedule{bound}, modelled efficiency {c.efficiency:.0%}"
    )
    return kernel_plan(base, choice, dev, reason, notes)


def _decode_candidate(v: tables.Variant, m, n, k, groups, clusters, call: Call, dev, memory_bound: bool) -> Candidate:
    """A decode row ranked on its modelled seconds (cost_model.decode_seconds),
    in tile-units like the grouped rows; its efficiency is the HBM floor over that time."""
    seconds = cost_model.decode_seconds(v, m, n, k, groups, clusters, call.dtype, call.out_dtype, dev)
    edge = cost_model.ridge(dev, call.dtype)
    floor = cost_model.grouped_bytes(m, n, k, groups, call.dtype, call.out_dtype) / edge[2] if edge else 0.0
    items = cost_model.decode_items(v, m, n, groups)
    time = cost_model.seconds_to_tile_units(seconds, k, dev, call.dtype)
    efficiency = floor / seconds if seconds else 0.0
    return Candidate((time,), _schedule(v), items / clusters, efficiency, raster="along_m", memory_bound=memory_bound)
