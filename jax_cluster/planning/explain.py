"""Plan.explain(): the decision, its evidence, the cluster contract, the
timeline and how to check it, as plain text."""

from __future__ import annotations

import math

from jax_cluster.planning import cost_model, routing, schedule, tables


def _ragged(p) -> bool:
    return p.problem != "dense"


def _decode(p) -> bool:
    return p.uses_kernel and p.kind == "decode"


def _decision(p) -> str:
    if not p.uses_kernel:
        return f"Use {_fallback(p)}: {p.reason}."
    if _decode(p):
        return (
            f"Run {p.variant} on {p.arch}: clusters of {p.cluster_m} CTAs that split K, each work item "
            f"up to {p.tile_m} rows of one group by {p.tile_n} columns on the CUDA cores, "
            f"{p.schedule} round-robin over the items of {p.groups} groups."
        )
    over = f" over the tiles of {p.groups} groups" if _ragged(p) else ""
    fused = {
        "bias_act": ", with the bias, activation and C fused into its epilogue",
        "gated": ", its epilogue writing act(gate) * up of each gate and up block pair (N/2 columns)",
    }.get(p.epilogue, "")
    return (
        f"Run {p.variant} on {p.arch}: a {p.cluster_m}x{p.cluster_n} cluster of "
        f"{p.tile_m}x{p.tile_n}x{p.tile_k} tiles, {p.schedule} persistent schedule{over}"
        f"{fused}."
    )


def _evidence(p) -> list[str]:
    d = p.device
    size = (
        f"{p.problem} M={p.m} N={p.n} K={p.k} groups={p.groups} (GEMM view)"
        if _ragged(p)
        else f"M={p.m} N={p.n} K={p.k} batch={p.batch}"
    )
    rows = [
        f"problem: {size}, {p.dtype}->{p.out_dtype}, A {p.a_major}-major, B {p.b_major}-major (given)",
        f"device: {d.describe()} ({d.source})",
    ]
    if p.uses_kernel:  # the floor and the waves are the kernel plan's evidence, not XLA's
        bound = _roofline(p)
        if bound:
            rows.append(bound)
        rows.append(f"resident clusters: {p.max_active_clusters} ({p.residency})")
        rows.append(f"waves: {p.waves:.2f}; {_efficiency(p)}")
        if not _ragged(p) and p.schedule in ("static", "dynamic"):
            rows.append(
                f"per-tile handoff: static step {cost_model.STATIC_STEP_OVERHEAD} tile-times, "
                f"work-queue fetch {cost_model.DYNAMIC_FETCH_OVERHEAD} (modelled from H200 timings, "
                "where the work queue led static on the same tile every time), plus "
                f"{cost_model.WORK_QUEUE_RESET_S * 1e6:.1f} us a call to zero the queue's counter "
                "(so a wave or less of tiles takes the static walk)"
            )
        rows.append(f"workspace: {p.workspace_bytes} bytes through XLA (queried from the variant)")
    rows.extend(f"note: {note}" for note in p.notes)
    return rows


def _efficiency(p) -> str:
    if _decode(p):
        return (
            f"modelled efficiency {p.predicted_efficiency:.0%} (the HBM floor over the modelled time: "
            "the weight stream, at the device's bandwidth or at the CTAs' pull rate with a cluster "
            "reduction per item, or the CUDA cores' FMAs, whichever is longer)"
        )
    return (
        f"modelled efficiency {p.predicted_efficiency:.0%} (output tiles' MMA time over the resident "
        "clusters' makespan" + (", stretched to the HBM time" if p.memory_bound else "") + ")"
    )


def _fallback(p) -> str:
    if p.dtype in tables.BLOCK_SCALED_DTYPES:
        return "the ops' bf16 path on the dequantized operands"
    if p.epilogue == "gated":
        return (
            "the plain grouped product on its own plan (XLA's ragged_dot in float32 under a "
            "pinned plan), then act(gate) * up on XLA"
        )
    if p.problem != "dense":
        return "XLA's ragged_dot"
    if p.device.platform == "cuda" and routing.pads_unit_k(p.m, p.n, p.k, p.batch, tables.NUMPY_DTYPES.get(p.dtype)):
        return (
            "XLA's dot with K padded to 2 by zeros (XLA turns a K = 1 dot into an elementwise multiply, "
            "which runs slower than its GEMM of the padded product)"
        )
    return "XLA's dot"


def _roofline(p) -> str:
    edge = cost_model.ridge(p.device, p.dtype)
    if edge is None or p.problem not in ("dense", "ragged_m"):
        return ""
    if p.problem == "dense":
        sizes = tables.DTYPE_BYTES
        moved = cost_model.bytes_moved(p.m, p.n, p.k, p.batch, sizes.get(p.dtype, 2), sizes.get(p.out_dtype, 2))
        flops, counted = 2 * p.batch * p.m * p.n * p.k, ""
    else:
        moved = cost_model.grouped_bytes(p.m, p.n, p.k, p.groups, p.dtype, p.out_dtype)
        flops = 2 * p.m * p.n * p.k
        counted = (
            f", counting the weights of min(G, M) = {min(p.groups, p.m)} groups (a group without rows streams none)"
        )
    if not moved:
        return ""
    ai = flops / moved
    point, peak, bandwidth = edge
    kind = "memory-bound" if ai < point else "compute-bound"
    # dense plans always rank on the longer of the two; grouped ones only when memory-bound
    ranked = p.problem == "dense" or ai < point
    return (
        f"arithmetic intensity {ai:.0f} FLOP/byte against a ridge point of {point:.0f} "
        f"({peak / 1e12:.0f} TFLOP/s / {bandwidth / 1e12:.2f} TB/s, modelled): {kind}{counted}; "
        f"HBM floor {moved / bandwidth * 1e6:.1f} us for {moved / 1e6:.1f} MB"
        + (", and the planner ranks candidates by the longer of it and their compute makespan" if ranked else "")
    )


def _decode_contract(p) -> list[str]:
    s = p.cluster_m
    if p.dtype in tables.BLOCK_SCALED_DTYPES:
        block = tables.SCALE_BLOCK
        slice_and_operands = [
            f"CTA r of {s}: whole scale blocks of K = {p.k}, blocks [r*ceil(K/{block}/{s}), "
            f"(r+1)*ceil(K/{block}/{s})) of every item it takes, all {p.tile_n} columns; each warp owns "
            f"{p.tile_n // tables.DECODE_BLOCKWISE_WARPS} of them, four a step, eight lanes reading one "
            f"column's {block}-value block in 16-byte loads, {p.stages} blocks of each column in flight per lane",
            f"A: the item's rows (at most {p.tile_m}) staged in shared memory as float32 times their tile "
            f"scales, {p.stages} blocks of K at a time; B's block scale multiplies each lane's 16-value sum",
            f"DSMEM: each warp's column sums (its lanes' shuffled together) go to its CTA's shared memory; "
            f"after a cluster barrier, CTA r sums every {s}th slot of the item's tile over the {s} CTAs' "
            "shared memory and writes it; two buffers alternate by item, so one cluster barrier per item "
            "orders the reads before the next writes",
        ]
    else:  # a step's values of a row of A fill one 16-byte load (the kernel asserts it)
        slice_and_operands = [
            f"CTA r of {s}: rows [r*S, (r+1)*S) of K = {p.k}, S = ceil(K/{s}) rounded up to a multiple of "
            f"{p.stages}, of every item it takes, all {p.tile_n} columns; each lane reads 8 columns of a row "
            f"of B in one 16-byte load, {p.stages} loads in flight per lane",
            f"A: an item of up to {tables.DECODE_REGISTER_ROWS} rows is read in registers, each of its "
            f"{p.tile_k} warps taking {p.stages} consecutive rows of K a step and each row's {p.stages} values "
            f"of A in one 16-byte load beside B's, with no block barrier; a larger item (at most {p.tile_m} "
            f"rows) is staged in shared memory as float32, 256 rows of K at a time, its warps taking every "
            f"{p.tile_k}th row of B",
            "DSMEM: each CTA adds up its warps' sums in its own shared memory; after a cluster barrier, "
            f"CTA r sums every {s}th slot of the item's tile over the {s} CTAs' shared memory and writes it; "
            "two buffers alternate by item, so one cluster barrier per item orders the reads before the next "
            "writes",
        ]
    return [
        *slice_and_operands,
        "no multicast: each CTA reads its own slice of B, and A is a few rows",
        "barriers: one cluster barrier (arrive/wait) per item, and one before exit (no CTA leaves "
        "while its partial sums may still be read)",
        f"groups: every CTA scans group_sizes (at most {tables.DECODE_MAX_GROUPS}) into shared memory; "
        f"a group of more than {p.tile_m} rows spans several items",
    ]


def _contract(p) -> list[str]:
    if not p.uses_kernel:
        return [f"no cluster: XLA's own {'ragged_dot' if _ragged(p) else 'dot'} runs"]
    if _decode(p):
        return _decode_contract(p)
    rows = []
    cta_m = p.tile_m // 2 if p.mma == "2cta" else p.tile_m
    for cy in range(p.cluster_n):
        for cx in range(p.cluster_m):
            rows.append(
                f"CTA ({cx},{cy}): rows [{cx * cta_m}, {(cx + 1) * cta_m}) of the cluster tile, "
                f"cols [{cy * p.tile_n}, {(cy + 1) * p.tile_n}), all of K in {p.tile_k} steps"
            )
    if p.swap_ab:
        rows.append(
            f"operands swapped: the kernel computes D^T = B^T·A^T, so the {p.tile_m} rows "
            f"of M are the MMA's N side (wgmma N may be small; a cooperative M tile is "
            f"128) and each CTA streams {p.tile_n} columns of B as its A operand; D^T is "
            "stored column-major, which is D row-major"
        )
    if p.cluster_m > 1:
        rows.append(f"B tiles are multicast by TMA to the {p.cluster_m} CTAs along M")
    if p.cluster_n > 1:
        rows.append(f"A tiles are multicast by TMA to the {p.cluster_n} CTAs along N")
    if p.mma == "2cta":
        rows.append("MMA: cta_group::2 UMMA over the CTA pair, accumulators in TMEM")
    if p.schedule == "dynamic" and p.cluster_m * p.cluster_n > 1:
        rows.append(
            "work queue: the leader CTA takes each cluster tile from a global counter "
            "(atomicAdd) and writes it into every CTA's shared memory (st.async over "
            "DSMEM, completing each CTA's mbarrier)"
        )
    elif p.schedule == "dynamic":
        rows.append(
            "work queue: each CTA's scheduler warp takes the next tile from a global "
            "counter (atomicAdd) and passes it to its warps through shared memory"
        )
    elif p.schedule == "clc" and _ragged(p):
        rows.append(
            "Cluster Launch Control: one cluster is launched per tile of an upper bound "
            "on the tile count; a cluster that finishes cancels one not yet launched "
            "and maps its id to (group, m, n) through tile_start, the device-side scan "
            "of tiles per group; ids past the last tile end the cluster"
        )
    if p.cluster_m * p.cluster_n > 1:
        rows.append("barriers: cluster-scoped mbarriers for the multicast pipeline; leader CTA (0,0)")
    else:
        why = ""
        if not _ragged(p) and p.m <= p.tile_m:  # one M tile
            why = f"; with one M tile a 2x1 cluster would pad M={p.m} and leave half the SMs streaming no B"
        rows.append(f"no cluster: nothing is multicast, barriers are CTA-scoped{why}")
    rows.append(f"stages: {p.stages}; {_walk(p)}")
    if p.epilogue == "bias_act":
        rows.append(
            "epilogue: act(alpha*acc + beta*C + bias[n]) in registers before the TMA "
            "store; C arrives by TMA only when beta != 0, bias is broadcast per column, "
            "the activation is a run-time argument"
        )
    return rows


def _walk(p) -> str:
    if p.schedule == "dynamic" and not _ragged(p):
        minor, major = ("M", "N") if p.raster == "along_n" else ("N", "M")
        rows = math.ceil(p.m / p.tile_m / p.cluster_m) if minor == "M" else math.ceil(p.n / p.tile_n / p.cluster_n)
        width = min(p.swizzle, rows)  # the device narrows a band to the grid
        return (
            f"queue order: bands of {width} cluster tiles across {minor}, walked "
            f"along {major}, every other band backwards; a last band the grid cannot fill "
            "is narrower, so no padded tile runs"
        )
    return f"raster {p.raster}, swizzle {p.swizzle}"


def _timeline(p) -> list[str]:
    if not p.uses_kernel:
        return ["not modelled for the fallback"]
    if _decode(p):
        return [
            f"work items: each non-empty group's rows in chunks of {p.tile_m}, times "
            f"{math.ceil(p.n / p.tile_n)} column tiles; group_sizes stay on the device, so the count "
            "is known there only",
            f"static: cluster c of {p.max_active_clusters} takes items c, c + {p.max_active_clusters}, ...; "
            "items cost the same (the same K and columns; a chunk's row count changes only its FMAs)",
        ]
    if p.problem != "dense":
        if p.schedule == "static":
            how = (
                f"static: cluster c of the {p.max_active_clusters} resident ones takes cluster tiles c, "
                f"c + {p.max_active_clusters}, ... of the groups' tiles in order (CUTLASS's group "
                "scheduler), balanced where the tiles cost about the same (large groups)"
            )
        else:
            how = (
                f"{p.schedule}: each {'cluster' if p.schedule == 'clc' else 'CTA'} takes the "
                "next tile of any group when it frees up"
            )
        return [
            f"{p.groups} groups: tile counts follow group_sizes, which stay on the device, "
            "so no wave count is known at trace time",
            how + "; replay a distribution with jax_cluster.planning.schedule.compare(grouped_tile_costs(...), CTAs)",
        ]
    full = math.floor(p.waves)
    rows = [
        f"{full} full wave(s) and a tail of {p.waves - full:.0%} of the resident clusters",
        f"{p.schedule}: {_efficiency(p)}",
    ]
    if p.memory_bound:
        rows.append(
            "memory-bound: the makespans below count the MMAs only; the plan was ranked "
            "on HBM traffic (the floor, partial tiles, and how many SMs stream at once)"
        )
    tiles = round(p.waves * p.max_active_clusters)
    if 0 < tiles <= cost_model.SIMULATED_TILES_MAX:
        sims = schedule.compare(
            schedule.uniform_tiles(tiles),
            p.max_active_clusters,
            schedules=("static", "dynamic", "stream_k"),
            fetch_overhead=cost_model.DYNAMIC_FETCH_OVERHEAD,
            step_overhead=cost_model.STATIC_STEP_OVERHEAD,
            fixup_cost=cost_model.STREAM_K_FIXUP_COST,
        )
        for name, sim in sims.items():
            chosen = "  <- this plan" if name == p.schedule else ""
            runs = "" if name in tables.SCHEDULES_BY_KIND.get(p.kind, ()) else " (not a schedule of this kind)"
            rows.append(
                f"{name:<8} makespan {sim.makespan:.2f} tile-times, tail efficiency "
                f"{sim.tail_efficiency:.0%} (simulated: work over workers x makespan){chosen}{runs}"
            )
    return rows


def _validation(p) -> list[str]:
    if _ragged(p):  # wave boundaries depend on group sizes only the device knows
        first = "compare with lax.ragged_dot" + ("" if p.uses_kernel else "; nothing kernel-specific to check")
        return [
            first,
            "group edge cases: empty, one-row and tile-straddling groups; rows past the "
            "last group are zero; negative sizes count as 0, groups are cut at M",
        ]
    if not p.uses_kernel:
        return ["compare with lax.dot_general; nothing kernel-specific to check"]
    c = p.max_active_clusters
    if p.memory_bound:
        prediction = [
            "prediction: memory-bound, so the time grows with K like the bytes, and no "
            "schedule beats the HBM floor in the evidence"
        ]
    elif "stream_k" in tables.SCHEDULES_BY_KIND.get(p.kind, ()):
        prediction = ["prediction: at waves just above an integer, stream_k beats static"]
    else:
        prediction = []
    return [
        f"boundary tile counts: {max(1, c - 1)}, {c}, {c + 1} clusters of work",
        *prediction,
        f"fallback: {_fallback(p)} if the variant cannot run ({p.variant} missing, misaligned operands or "
        "another device)",
    ]


def explain(p) -> str:
    parts = [
        ("Decision", [_decision(p)]),
        ("Evidence", _evidence(p)),
        ("Contract", _contract(p)),
        ("Timeline", _timeline(p)),
        ("Validation", _validation(p)),
    ]
    lines = []
    for i, (title, rows) in enumerate(parts, 1):
        lines.append(f"{i}. {title}")
        lines.extend(f"   {row}" for row in rows)
    return "\n".join(lines)
