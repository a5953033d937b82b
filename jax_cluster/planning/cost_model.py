"""The cost model: every constant the planners, `explain` and the tail
simulator's callers read, and the formulas that turn a candidate into a time.

Times are in tile-units: the time one SM takes for one output element over
the whole K. The peaks are modelled, not queried (CUDA reports neither):
dense bf16 tensor throughput per SM at the boost clock, and HBM bandwidth by
product name, else by architecture. `Plan.explain()` labels them so.
"""

from __future__ import annotations

import math

from jax_cluster.planning import tables

PORTABLE_CLUSTER_SIZE = 8  # CUDA guarantees clusters up to 8 CTAs; more needs an opt-in

# Relative mainloop efficiency of an MMA tile (a modelled lead, refined on the
# H200 by the benchmarks): smaller tiles re-read operands more per FLOP, and a
# 2-CTA UMMA halves each CTA's share of B.
TILE_EFFICIENCY = {
    ("sm90a", 128, 256): 1.0,
    ("sm90a", 128, 128): 0.88,
    ("sm100f", 256, 256): 1.0,
    ("sm100f", 128, 256): 0.92,
}
OTHER_TILE_EFFICIENCY = 0.8
STREAM_K_OVERHEAD = 1.10  # partial-tile fix-up traffic, modelled
# Per-tile handoff costs, in tile-times (measured leads from the H200). The
# work queue pays one atomic fetch per tile, mostly hidden behind the previous
# tile. The static grid-stride walk (CUTLASS's stream-K scheduler in its
# data-parallel mode) came out behind the work queue on the same tile in all
# 14 plain-kernel comparisons timed there, by 0.3-3.6% (median 1.5%), and by
# 3.7-12% for the fused epilogue (benchmarks/results/h200/schedules_bf16.json),
# so each of its steps costs more than a fetch.
DYNAMIC_FETCH_OVERHEAD = 0.005
STATIC_STEP_OVERHEAD = 0.018
# The work queue's counter is zeroed before every call (a 4-byte fill on the
# stream, or a node before the kernel's in a command buffer), a fixed cost that
# the static walk does not pay; a wave or less of tiles gains nothing from the
# queue in exchange. Measured lead, rounded down: in chains of 2048^3 GEMMs in
# XLA's graphs on an H100 the work queue's row cost 1.1 us a call more than the
# static row of the same tile (benchmarks/results/h100/investigations/host_overhead_3_rounds_*).
WORK_QUEUE_RESET_S = 1.0e-6
# What a partial tile's fix-up costs in the simulator's stream-K replay, in tile-times.
STREAM_K_FIXUP_COST = 0.1
# explain() replays the tail up to this many tiles; beyond it the tail is a rounding error.
SIMULATED_TILES_MAX = 20000
SPLIT_K_SPLITS = (2, 4)
SPLIT_K_MIN_K_TILES = 8  # fewer k-tiles leave each split too little work to pay off
STREAM_K_MIN_K_TILES = 4  # below this stream-K has nothing to split

# CUTLASS lowers the swizzle to fit the smaller tile dimension: s needs min >= this.
SWIZZLE_MIN_TILES = {2: 2, 4: 3, 8: 6}
SWIZZLE_PADDING_BUDGET = 1.03

# Share of the SMs that must stream at once to saturate HBM, and the bytes a
# partial tile costs (fp32 out to the workspace and back). Measured leads from
# bench_planner on the H200 at M <= 128 (planner_vs_exhaustive.json): one wave
# of whole tiles on 128 of 132 SMs beat stream-K by 11%, on 112 of 132 it lost
# by 5%, and on 32 of 132 it lost by 18%.
SATURATING_SM_SHARE = 0.95
PARTIAL_BYTES_PER_ELEMENT = 8
# A streaming CTA keeps its pipeline's weight stages in flight (stages x
# tile_n x tile_k elements), so by Little's law it pulls that many bytes per
# loaded-HBM latency, which grows with the loads it keeps queued. Fitted on
# the H200's decode runs (OLMoE and DeepSeek-V3 gate projections at 8 rows,
# a ~10 us fixed cost per call taken off): 3.1 us with 4 stages of 128x256x64,
# 3.8-3.9 us with 8 stages of 128x64x64. A lead elsewhere.
LOADED_HBM_LATENCY_S = 2.35e-6
LATENCY_PER_STAGE_S = 0.19e-6
# Grouped rows this narrow (128x64) are decode rows: measured only where the
# weight stream bounds the call, so the planner takes them there alone.
DECODE_TILE_N_MAX = 64
# The decode rows (kind "decode"), fitted by benchmarks/fit_decode.py on the
# H200's Mixtral and OLMoE decode cases (Qwen3's held out): their FMAs on the
# CUDA cores per second per SM (a tenth of the fp32 peak: each FMA also loads
# a row of A from shared memory and converts a weight), the latency a CTA's
# loads in flight take to return (its pull rate: stages x 16 bytes x 32 lanes
# x warps per latency), and the cluster reduction's cost per item and CTA.
# The pull rate is a fitted rate, not a mechanism: twice the loads in flight
# did not shorten these calls (docs/performance.md, "Twice the loads").
FMA_PER_SM = {"sm90a": 6e10}
DECODE_LOADED_LATENCY_S = 2.0e-6
DECODE_REDUCTION_S = 0.3e-6
# Decode rows take a call (unpinned) where its groups hold at most this many
# rows on average, if the routing is uniform (expected_filled_groups); the
# grouped GEMM's tensor cores win beyond (decode_rows.json: the decode rows
# ran 1.1-1.7x the grouped GEMM at 1.0-1.6 rows per group and 0.2-0.6x from 4).
DECODE_MAX_ROWS_PER_GROUP = 2.0

# dense bf16/f16 tensor-core FLOP/s per SM (H100/H200 SXM: ~989 TFLOP/s on 132
# SMs; B200: ~2250 TFLOP/s on 148 SMs)
FLOPS_PER_SM = {"sm90a": 989e12 / 132, "sm100f": 2250e12 / 148}
# fp8 tensor cores run twice bf16's rate on both archs
PEAK_SCALE_BY_DTYPE = {"e4m3": 2.0, "mxe4m3": 2.0}
# HBM bytes/s by the device name CUDA reports; the arch default is the
# smallest of its family, so "memory-bound" is never claimed too late.
BANDWIDTH_BY_NAME = {"H200": 4.8e12, "H100": 3.35e12, "B200": 8.0e12, "GB200": 8.0e12}
BANDWIDTH_BY_ARCH = {"sm90a": 3.35e12, "sm100f": 8.0e12}


# --------------------------------------------------------------------------- roofline


def bytes_moved(m: int, n: int, k: int, batch: int, in_bytes: int, out_bytes: int) -> int:
    """The HBM bytes no schedule avoids: A and B read once, D written once."""
    return batch * ((m * k + k * n) * in_bytes + m * n * out_bytes)


def intensity(m: int, n: int, k: int, batch: int, in_bytes: int, out_bytes: int) -> float:
    """FLOP per byte if A and B are read once and D written once."""
    moved = bytes_moved(m, n, k, batch, in_bytes, out_bytes)
    return 2 * batch * m * n * k / moved if moved else 0.0


def ridge(device, dtype: str | None = None) -> tuple[float, float, float] | None:
    """(FLOP/byte, peak FLOP/s, bandwidth bytes/s) of the device for inputs
    of `dtype` (bf16's rate when None), modelled; None for a device without
    a kernel family or an SM count."""
    arch = device.arch
    if arch is None or not device.sm_count:
        return None
    peak = FLOPS_PER_SM[arch] * device.sm_count * (PEAK_SCALE_BY_DTYPE.get(dtype, 1.0) if dtype else 1.0)
    name = (device.name or "").upper()
    bandwidth = next((bw for key, bw in BANDWIDTH_BY_NAME.items() if key in name.split()), BANDWIDTH_BY_ARCH[arch])
    return peak / bandwidth, peak, bandwidth


# --------------------------------------------------------------------------- tiles and waves


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def cluster_tiles(v: tables.Variant, m, n, batch, swizzle) -> int:
    """Cluster tiles the persistent scheduler walks: CUTLASS pads the tile grid
    to multiples of swizzle x cluster, and padded tiles still run the mainloop
    (the work queue's walk pads to the cluster only)."""
    swizzle = swizzle if v.pads_swizzle else 1
    tiles_m = _round_up(math.ceil(m / v.cta_tile_m), swizzle * v.cluster_m)
    tiles_n = _round_up(math.ceil(n / v.tile_n), swizzle * v.cluster_n)
    return tiles_m * tiles_n // v.cluster_size * batch


def raster_and_swizzle(v: tables.Variant, m, n, batch) -> tuple[str, int]:
    tiles_m, tiles_n = math.ceil(m / v.cta_tile_m), math.ceil(n / v.tile_n)
    # CUTLASS's own rule: walk along M when the grid is wider than tall. The
    # work queue walks along M, in bands of N, on any grid: on the H200 that
    # beat bands of M on all four large shapes timed (bench_walk: 0.4-2.9%).
    raster = "along_m" if tiles_n > tiles_m or not v.pads_swizzle else "along_n"
    base = cluster_tiles(v, m, n, batch, 1)
    swizzle = 1
    for s, need in SWIZZLE_MIN_TILES.items():
        # Wider swizzles reuse operands in L2, but only while padding stays cheap
        # (always, for the work queue's walk).
        if min(tiles_m, tiles_n) >= need and (cluster_tiles(v, m, n, batch, s) <= base * SWIZZLE_PADDING_BUDGET):
            swizzle = s
    return raster, swizzle


def score(v: tables.Variant, m, n, k, batch, clusters, schedule, swizzle, splits=1):
    """(modelled compute time in tile-units, waves, efficiency) for one candidate."""
    tiles = cluster_tiles(v, m, n, batch, swizzle) * splits
    waves = tiles / clusters
    # the CTAs of a cluster work side by side: a wave costs one CTA tile
    efficiency = TILE_EFFICIENCY.get((v.arch, v.tile_m, v.tile_n), OTHER_TILE_EFFICIENCY)
    tile_cost = v.cta_tile_m * v.tile_n / efficiency
    # static and dynamic: the makespan of equal tiles on `clusters` workers, as
    # planning.schedule.simulate computes it (tests check that); each tile but
    # a cluster's first pays its schedule's handoff.
    if schedule == "stream_k":
        time = waves * tile_cost * STREAM_K_OVERHEAD
    elif schedule == "split_k":  # each unit runs K/splits, then the partials are reduced
        time = math.ceil(waves) * tile_cost / splits * STREAM_K_OVERHEAD
    else:
        step = DYNAMIC_FETCH_OVERHEAD if schedule == "dynamic" else STATIC_STEP_OVERHEAD
        time = (math.ceil(waves) * (1 + step) - step) * tile_cost
    work = m * n * batch / (time * clusters * v.cluster_size)
    return time, waves, min(1.0, work)


def grouped_score(v: tables.Variant, m, n, k, groups, problem, clusters, schedule):
    """(time, waves, efficiency) of a grouped problem, modelled as evenly filled groups."""
    if problem == "ragged_k":  # one K'xN' output per group, each over ~M/G rows
        return score(v, m, n, k, groups, clusters, schedule, 1)
    # ragged_m: each group's last cluster tile along M is on average half empty
    rows = m + (min(groups, m) - 1) * v.cta_tile_m * v.cluster_m // 2
    time, waves, eff = score(v, rows, n, k, 1, clusters, schedule, 1)
    return time, waves, eff * m / rows


def grouped_tiles(v: tables.Variant, m, n, groups) -> int:
    """Tiles of a ragged_m problem with evenly filled groups: each non-empty
    group (at most one per row) covers its rows with whole tiles."""
    filled = min(groups, m)
    if filled == 0:
        return 0
    return filled * math.ceil(m / filled / v.cta_tile_m) * math.ceil(n / v.tile_n)


def grouped_bytes(m, n, k, groups, dtype, out) -> int:
    """The HBM bytes of a ragged_m problem: the rows, the weights of the
    groups that can receive rows (at most one per row), and the output."""
    in_bytes, out_bytes = tables.DTYPE_BYTES[dtype], tables.DTYPE_BYTES[out]
    return (m * k + min(groups, m) * k * n) * in_bytes + m * n * out_bytes


def grouped_memory_bound(m, n, k, groups, dtype, out, device) -> bool:
    """Whether streaming the weights takes longer than the MMAs at peak."""
    edge = ridge(device, dtype)
    moved = grouped_bytes(m, n, k, groups, dtype, out)
    return edge is not None and moved > 0 and 2 * m * n * k / moved < edge[0]


def grouped_memory_time(v: tables.Variant, m, n, k, groups, clusters, dtype, out, device) -> float:
    """The HBM time of a ragged_m problem in tile-units (0 without a ridge
    point): the whole stream at the device's bandwidth, or, when slower, the
    waves of tiles each busy CTA streams at its own pull rate
    (cta_pull_rate), whichever is longer."""
    edge = ridge(device, dtype)
    tiles = grouped_tiles(v, m, n, groups)
    if edge is None or k == 0 or tiles == 0:
        return 0.0
    bandwidth = edge[2]
    busy = min(tiles, clusters * v.cluster_size)
    tile_bytes = k * v.tile_n * tables.DTYPE_BYTES[dtype]
    seconds = max(
        grouped_bytes(m, n, k, groups, dtype, out) / bandwidth,
        math.ceil(tiles / busy) * tile_bytes / cta_pull_rate(v, dtype),
    )
    return seconds_to_tile_units(seconds, k, device, dtype)


def schedule_fixed_cost(schedule: str, k: int, device, dtype) -> float:
    """A schedule's cost per call on top of its tiles', in tile-units: the
    work queue's counter reset; nothing for the others."""
    if schedule != "dynamic":
        return 0.0
    return seconds_to_tile_units(WORK_QUEUE_RESET_S, k, device, dtype)


def seconds_to_tile_units(seconds: float, k: int, device, dtype) -> float:
    """`seconds` in tile-units (0 without a modelled ridge point or K)."""
    edge = ridge(device, dtype)
    if edge is None or k == 0:
        return 0.0
    return seconds * (edge[1] / device.sm_count) / (2 * k)


def expected_filled_groups(m: int, groups: int) -> float:
    """Groups that receive at least one of m rows when each row picks one of
    the groups uniformly: G (1 - (1 - 1/G)^m), at least 1, at most min(G, m)."""
    if m <= 0 or groups <= 0:
        return 0.0
    return min(float(min(groups, m)), max(1.0, groups * (1.0 - (1.0 - 1.0 / groups) ** m)))


def expected_rows_per_group(m: int, groups: int) -> float:
    """Rows per group that receives any, under uniform routing (0 without rows)."""
    filled = expected_filled_groups(m, groups)
    return m / filled if filled else 0.0


def decode_takes(m: int, groups: int) -> bool:
    """Whether decode rows take an unpinned ragged_m call (DECODE_MAX_ROWS_PER_GROUP)."""
    return 0 < expected_rows_per_group(m, groups) <= DECODE_MAX_ROWS_PER_GROUP


def decode_items(v: tables.Variant, m, n, groups) -> int:
    """Work items of a decode row: each group that receives rows (as many as
    expected_filled_groups) has its rows in chunks of tile_m, times the
    column tiles."""
    filled = round(expected_filled_groups(m, groups))
    if filled == 0:
        return 0
    return filled * math.ceil(m / filled / v.tile_m) * math.ceil(n / v.tile_n)


def decode_seconds(v: tables.Variant, m, n, k, groups, clusters, dtype, out, device) -> float:
    """A decode row's time: the longer of the weight stream and its FMAs on
    the CUDA cores (a chunk of r rows runs the smallest power of two >= r).
    The stream is the whole of it (the weights of the groups expected to
    receive rows) at the device's bandwidth, or, when longer, each cluster's
    items one after another: a CTA's K slice of an item at its pull rate,
    plus the cluster's reduction of the item."""
    edge, items = ridge(device, dtype), decode_items(v, m, n, groups)
    if edge is None or items == 0:
        return 0.0
    filled = round(expected_filled_groups(m, groups))
    per_group = math.ceil(m / filled)
    chunks = math.ceil(per_group / v.tile_m)
    last = per_group - (chunks - 1) * v.tile_m
    padded_rows = (chunks - 1) * v.tile_m + 2 ** math.ceil(math.log2(last))
    columns = math.ceil(n / v.tile_n) * v.tile_n
    in_bytes, out_bytes = tables.DTYPE_BYTES[dtype], tables.DTYPE_BYTES[out]
    slice_bytes = math.ceil(k / v.cluster_size) * v.tile_n * in_bytes
    pull = bytes_in_flight(v, dtype) / DECODE_LOADED_LATENCY_S
    stream = max(
        ((m * k + filled * k * n) * in_bytes + m * n * out_bytes) / edge[2],
        math.ceil(items / clusters) * (slice_bytes / pull + DECODE_REDUCTION_S * v.cluster_size),
    )
    busy = min(device.sm_count, min(items, clusters) * v.cluster_size)
    fmas = filled * padded_rows * columns * k
    return max(stream, fmas / (FMA_PER_SM[v.arch] * busy))


def bytes_in_flight(v: tables.Variant, dtype) -> int:
    """The weight bytes one CTA of a grouped or decode row keeps in flight: its stages' tiles."""
    return v.stages * v.tile_n * v.tile_k * tables.DTYPE_BYTES[dtype]


def cta_pull_rate(v: tables.Variant, dtype) -> float:
    """Bytes/s one CTA streams weights at: its stages in flight per loaded-HBM latency."""
    latency = LOADED_HBM_LATENCY_S + v.stages * LATENCY_PER_STAGE_S
    return bytes_in_flight(v, dtype) / latency


# --------------------------------------------------------------------------- memory


def _problem_bytes(m, n, k, batch, dtype, out) -> int:
    return bytes_moved(m, n, k, batch, tables.DTYPE_BYTES[dtype], tables.DTYPE_BYTES[out])


def hbm_tile_units(moved: int, k: int, device, dtype: str | None = None) -> float:
    """The HBM time of `moved` bytes in tile-units (0 without a modelled ridge point or K)."""
    edge = ridge(device, dtype)
    return 0.0 if edge is None else seconds_to_tile_units(moved / edge[2], k, device, dtype)


def streaming_stretch(busy: float, device) -> float:
    """How much longer the HBM time runs while only `busy` CTAs stream."""
    return max(1.0, SATURATING_SM_SHARE * device.sm_count / busy)


def memory_floor(m, n, k, batch, dtype, out, device) -> float:
    """The HBM time of `bytes_moved`, in tile-units (0 without a modelled
    ridge point): no schedule beats it."""
    return hbm_tile_units(_problem_bytes(m, n, k, batch, dtype, out), k, device, dtype)


def memory_time(v: tables.Variant, m, n, k, batch, clusters, schedule, swizzle, splits, floor, device):
    """`floor` for one candidate, in tile-units: plus the partial tiles' round
    trip (stream-K: about one per worker; split-K: splits - 1 per tile), and
    stretched while fewer CTAs stream (on average over the waves) than it takes
    to saturate HBM."""
    if floor == 0.0:
        return 0.0
    tiles = cluster_tiles(v, m, n, batch, swizzle) * v.cluster_size
    workers = clusters * v.cluster_size
    partials = {"stream_k": workers, "split_k": tiles * (splits - 1)}.get(schedule, 0)
    units = tiles * splits  # whole-tile schedules: a short last wave streams with fewer CTAs
    busy = workers if schedule == "stream_k" else units / math.ceil(units / workers)
    extra = partials * v.cta_tile_m * v.tile_n * PARTIAL_BYTES_PER_ELEMENT
    return floor * (1 + extra / _problem_bytes(m, n, k, batch, v.dtype, v.out)) * streaming_stretch(busy, device)
