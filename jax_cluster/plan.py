"""The Plan: every static choice one GEMM call makes, and the planner.

The kernel fields of `Plan` (KERNEL_FIELDS) travel to C++ as one struct
attribute with the same names (cc/common/plan.h); the rest record what the
plan was made for and why.
"""
from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

from jax_cluster import _ffi, roofline, variants
from jax_cluster.device import DeviceInfo, describe

KERNEL_FIELDS = ("variant", "arch", "tile_m", "tile_n", "tile_k", "cluster_m", "cluster_n",
                 "stages", "mma", "schedule", "splits", "raster", "swizzle", "sm_count",
                 "max_active_clusters")
_OVERRIDABLE = ("variant", "tile", "cluster", "schedule", "splits", "raster", "swizzle",
                "allow_nonportable_cluster")
PORTABLE_CLUSTER_SIZE = 8  # CUDA guarantees clusters up to 8 CTAs; more needs an opt-in
# Relative mainloop efficiency of an MMA tile (a modelled lead, refined on the
# H200 by the benchmarks): smaller tiles re-read operands more per FLOP, and a
# 2-CTA UMMA halves each CTA's share of B.
_TILE_EFFICIENCY = {("sm90a", 128, 256): 1.0, ("sm90a", 128, 128): 0.88,
                    ("sm100a", 256, 256): 1.0, ("sm100a", 128, 256): 0.92}
_STREAM_K_OVERHEAD = 1.10   # partial-tile fix-up traffic, modelled
# Per-tile handoff costs, in tile-times (measured leads from the H200). The
# work queue pays one atomic fetch per tile, mostly hidden behind the previous
# tile. The static grid-stride walk (CUTLASS's stream-K scheduler in its
# data-parallel mode) came out behind the work queue on the same tile in all
# 14 plain-kernel comparisons logged there, by 0.3-3.6% (median 1.5%), and by
# 3.7-12% for the fused epilogue (benchmarks/results/h200: linear_gemms*.log,
# schedules_bf16.log), so each of its steps costs more than a fetch.
DYNAMIC_FETCH_OVERHEAD = 0.005
STATIC_STEP_OVERHEAD = 0.018
SPLIT_K_SPLITS = (2, 4)
SPLIT_K_MIN_K_TILES = 8      # fewer k-tiles leave each split too little work to pay off


def dtype_name(dtype) -> str:
    dt = np.dtype(dtype)
    for name, ref in (("bf16", jnp.bfloat16), ("f16", jnp.float16), ("f32", jnp.float32)):
        if dt == np.dtype(ref):
            return name
    return dt.name


@dataclasses.dataclass(frozen=True)
class Plan:
    path: str                       # "kernel" or "xla"
    reason: str                     # why this path, in one sentence
    m: int
    n: int
    k: int
    batch: int
    dtype: str
    out_dtype: str
    a_major: str                    # "k": A is [M,K]; "m": A is [K,M]
    b_major: str                    # "k": B is [N,K]; "n": B is [K,N]
    device: DeviceInfo
    variant: str = ""
    arch: str = "none"
    tile_m: int = 0
    tile_n: int = 0
    tile_k: int = 0
    cluster_m: int = 1
    cluster_n: int = 1
    stages: int = 0
    mma: str = ""
    schedule: str = "static"
    splits: int = 1
    raster: str = "along_n"
    swizzle: int = 1
    sm_count: int = 0
    max_active_clusters: int = 0
    residency: str = "modelled"     # "queried" (cudaOccupancyMaxActiveClusters) or "modelled"
    workspace_bytes: int = 0
    waves: float = 0.0
    predicted_efficiency: float = 0.0
    notes: tuple[str, ...] = ()
    # "ragged_m" / "ragged_k" for a grouped GEMM (plan_ragged); m, n, k are then its GEMM view
    problem: str = "dense"
    groups: int = 0
    # "bias_act": the kernel also applies act(alpha*A·B + beta*C + bias) (jax_cluster.linear)
    epilogue: str = "none"
    # the chosen candidate's modelled HBM time exceeds its compute makespan
    memory_bound: bool = False

    @property
    def uses_kernel(self) -> bool:
        return self.path == "kernel"

    def ffi_attrs(self) -> dict:
        """The kernel fields, as the FFI handler's "plan" struct attribute."""
        out = {}
        for name in KERNEL_FIELDS:
            value = getattr(self, name)
            out[name] = np.int64(value) if isinstance(value, int) else value
        return out

    def explain(self) -> str:
        from jax_cluster.explain import explain
        return explain(self)

    def _repr_pretty_(self, printer, cycle):  # IPython / notebooks
        printer.text(self.explain())


# --------------------------------------------------------------------------- planner


def _alignment_problem(m, n, k, a_major, b_major, out_dtype) -> str:
    lead_a = ("K", k) if a_major == "k" else ("M", m)
    lead_b = ("K", k) if b_major == "k" else ("N", n)
    for label, (dim, size), width in (("A", lead_a, 2), ("B", lead_b, 2),
                                      ("the output", ("N", n), variants.DTYPE_BYTES[out_dtype])):
        if (size * width) % 16:
            return (f"TMA needs 16-byte leading dimensions: {label}'s {dim} = {size} "
                    f"x {width} bytes is not a multiple of 16")
    return ""


def why_xla(dev: DeviceInfo, dt: str, out: str, dims, a_major: str, b_major: str,
            overrides: dict, op: str) -> str:
    """Why no kernel can take this call at all ("" if one may): the checks
    every planner makes before it looks at the menu. `dims` = (M, N, K, count)."""
    if overrides.get("path") == "xla":
        return f"the caller asked for XLA's {op}"
    if dev.platform != "cuda":
        return f"the device is {dev.platform}, not a CUDA GPU"
    if dev.arch is None:
        return (f"compute capability {dev.compute_capability} has no kernel family "
                "(sm90a needs 9.0; sm100a needs 10.0 or 10.3)")
    if not _ffi.with_kernels():
        return _ffi.why_no_kernels()
    if dt not in ("bf16", "f16"):
        return f"the kernels take bf16 or f16 inputs, not {dt}"
    if out not in (dt, "f32"):
        return f"the kernels write {dt} or f32 from {dt} inputs, not {out}"
    if min(dims) == 0:
        return "the problem is empty"
    return _alignment_problem(*dims[:3], a_major, b_major, out)


def menu_rows(dev: DeviceInfo, problem: str, dt: str, out: str, dims, a_major: str,
              b_major: str, overrides: dict, caller: str, epilogue: str = "none"
              ) -> tuple[list[variants.Variant], str]:
    """The compiled rows of the device's arch for this problem, dtypes, layouts and
    epilogue that match the overrides, or ([], why XLA runs the call instead).
    `dims` = (M, N, K, count). Overrides that match no row raise."""
    why = why_xla(dev, dt, out, dims, a_major, b_major, overrides,
                  "dot" if problem == "dense" else "ragged_dot")
    if why:
        return [], why
    kind = ("" if problem == "dense" else f"{problem} ") + (
        "" if epilogue == "none" else f"{epilogue} ")
    compiled = _ffi.compiled_variant_names()
    rows = [v for v in variants.load_menu() if v.name in compiled and v.arch == dev.arch
            and v.problem == problem and v.epilogue == epilogue
            and (v.dtype, v.out, v.a_major, v.b_major) == (dt, out, a_major, b_major)]
    if not rows:
        return [], (f"no compiled {dev.arch} {kind}variant for {dt}->{out} with A {a_major}-major "
                    f"and B {b_major}-major")
    rows = [v for v in rows if _matches(v, overrides)]
    if not rows:
        raise ValueError(f"{caller}: no compiled {kind}variant matches {overrides}; "
                         f"the menu is in {variants.MENU_PATH.name}")
    return rows, ""


def _resident_clusters(v: variants.Variant, device: DeviceInfo) -> tuple[int, str]:
    """Clusters of `v` that fit at once: queried on a present GPU, else modelled."""
    if device.source == "queried" and _ffi.with_kernels():
        clusters = _ffi.extension().max_active_clusters(v.name, device.device_id)
        return clusters, "queried"
    return (device.sm_count or 0) // v.cluster_size, "modelled"


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def _cluster_tiles(v: variants.Variant, m, n, batch, swizzle) -> int:
    """Cluster tiles the persistent scheduler walks: CUTLASS pads the tile grid
    to multiples of swizzle x cluster, and padded tiles still run the mainloop
    (the work queue's walk pads to the cluster only)."""
    swizzle = swizzle if v.pads_swizzle else 1
    tiles_m = _round_up(math.ceil(m / v.cta_tile_m), swizzle * v.cluster_m)
    tiles_n = _round_up(math.ceil(n / v.tile_n), swizzle * v.cluster_n)
    return tiles_m * tiles_n // v.cluster_size * batch


# CUTLASS lowers the swizzle to fit the smaller tile dimension: s needs min >= this.
_SWIZZLE_MIN_TILES = {2: 2, 4: 3, 8: 6}
_SWIZZLE_PADDING_BUDGET = 1.03


def _raster_and_swizzle(v: variants.Variant, m, n, batch) -> tuple[str, int]:
    tiles_m, tiles_n = math.ceil(m / v.cta_tile_m), math.ceil(n / v.tile_n)
    # CUTLASS's own rule: walk along M when the grid is wider than tall. The
    # work queue walks along M, in bands of N, on any grid: on the H200 that
    # beat bands of M on all four large shapes timed (bench_walk: 0.4-2.9%).
    raster = "along_m" if tiles_n > tiles_m or not v.pads_swizzle else "along_n"
    base = _cluster_tiles(v, m, n, batch, 1)
    swizzle = 1
    for s, need in _SWIZZLE_MIN_TILES.items():
        # Wider swizzles reuse operands in L2, but only while padding stays cheap
        # (always, for the work queue's walk).
        if min(tiles_m, tiles_n) >= need and (
                _cluster_tiles(v, m, n, batch, s) <= base * _SWIZZLE_PADDING_BUDGET):
            swizzle = s
    return raster, swizzle


def _score(v: variants.Variant, m, n, k, batch, clusters, schedule, swizzle, splits=1):
    """(modelled compute time in tile-units, waves, efficiency) for one candidate.
    A tile-unit is the time one SM takes for one output element over the whole K."""
    cluster_tiles = _cluster_tiles(v, m, n, batch, swizzle) * splits
    waves = cluster_tiles / clusters
    # the CTAs of a cluster work side by side: a wave costs one CTA tile
    tile_cost = v.cta_tile_m * v.tile_n / _TILE_EFFICIENCY.get((v.arch, v.tile_m, v.tile_n), 0.8)
    # static and dynamic: the makespan of equal tiles on `clusters` workers, as
    # jax_cluster.schedule.simulate computes it (tests/test_plan.py checks that);
    # each tile but a cluster's first pays its schedule's handoff.
    if schedule == "stream_k":
        time = waves * tile_cost * _STREAM_K_OVERHEAD
    elif schedule == "split_k":  # each unit runs K/splits, then the partials are reduced
        time = math.ceil(waves) * tile_cost / splits * _STREAM_K_OVERHEAD
    else:
        step = DYNAMIC_FETCH_OVERHEAD if schedule == "dynamic" else STATIC_STEP_OVERHEAD
        time = (math.ceil(waves) * (1 + step) - step) * tile_cost
    efficiency = m * n * batch / (time * clusters * v.cluster_size)
    return time, waves, min(1.0, efficiency)


# Share of the SMs that must stream at once to saturate HBM, and the bytes a
# partial tile costs (fp32 out to the workspace and back). Measured leads from
# bench_planner on the H200 at M <= 128 (planner_vs_exhaustive.json): one wave
# of whole tiles on 128 of 132 SMs beat stream-K by 11%, on 112 of 132 it lost
# by 5%, and on 32 of 132 it lost by 18%.
_SATURATING_SM_SHARE = 0.95
_PARTIAL_BYTES_PER_ELEMENT = 8


def _bytes_moved(m, n, k, batch, dt, out) -> int:
    return roofline.bytes_moved(m, n, k, batch, variants.DTYPE_BYTES[dt], variants.DTYPE_BYTES[out])


def memory_floor(m, n, k, batch, dt, out, device) -> float:
    """The HBM time of `roofline.bytes_moved`, in the tile-units of `_score`
    (0 without a modelled ridge point): no schedule beats it."""
    edge = roofline.ridge(device)
    if edge is None:
        return 0.0
    _, peak, bandwidth = edge
    return _bytes_moved(m, n, k, batch, dt, out) / bandwidth * (peak / device.sm_count) / (2 * k)


def _memory_time(v: variants.Variant, m, n, k, batch, clusters, schedule, swizzle, splits,
                 floor, device) -> float:
    """`floor` for one candidate, in tile-units: plus the partial tiles' round
    trip (stream-K: about one per worker; split-K: splits - 1 per tile), and
    stretched while fewer CTAs stream (on average over the waves) than it takes
    to saturate HBM."""
    if floor == 0.0:
        return 0.0
    tiles = _cluster_tiles(v, m, n, batch, swizzle) * v.cluster_size
    workers = clusters * v.cluster_size
    partials = {"stream_k": workers, "split_k": tiles * (splits - 1)}.get(schedule, 0)
    units = tiles * splits  # whole-tile schedules: a short last wave streams with fewer CTAs
    busy = workers if schedule == "stream_k" else units / math.ceil(units / workers)
    extra = partials * v.cta_tile_m * v.tile_n * _PARTIAL_BYTES_PER_ELEMENT
    stretch = max(1.0, _SATURATING_SM_SHARE * device.sm_count / busy)
    return floor * (1 + extra / _bytes_moved(m, n, k, batch, v.dtype, v.out)) * stretch


def _candidate_schedules(v: variants.Variant, k: int, memory_bound: bool, overrides: dict):
    """(schedule, splits) pairs the planner scores for one row."""
    schedule = overrides.get("schedule", "split_k" if "splits" in overrides else None)
    if schedule is not None:  # _matches kept only variants that run it
        if schedule != "split_k":
            return [(schedule, int(overrides.get("splits", 1)))]  # the FFI rejects splits > 1
        return [(schedule, int(overrides.get("splits", 2)))] if "split_k" in v.schedules else []
    k_tiles = math.ceil(k / v.tile_k)
    out = [(s, 1) for s in v.schedules if s != "split_k" and (s != "stream_k" or k_tiles >= 4)]
    # split-K only where memory decides: there it spreads the weight stream over
    # more SMs with fewer partial tiles than stream-K (bench_planner, small M)
    if memory_bound and "split_k" in v.schedules and k_tiles >= SPLIT_K_MIN_K_TILES:
        out += [("split_k", s) for s in SPLIT_K_SPLITS]
    return out


def plan_gemm(m: int, n: int, k: int, *, dtype, out_dtype=None, batch: int = 1,
              a_major: str = "k", b_major: str = "n", device=None, epilogue: str = "none",
              **overrides) -> Plan:
    """Chooses among the compiled variants for C[M,N] = A·B (see `Plan`).

    `epilogue="bias_act"` plans for the fused bias/activation/C epilogue
    (`jax_cluster.linear`) and considers only rows that compile it.
    `overrides` pins choices: variant, tile=(m,n,k), cluster=(m,n), schedule,
    splits, raster, swizzle; or path="xla" to force the fallback.
    """
    if epilogue not in variants.EPILOGUES:
        raise ValueError(f"plan(): epilogue must be one of {variants.EPILOGUES}, got {epilogue!r}")
    unknown = set(overrides) - set(_OVERRIDABLE) - {"path"}
    if unknown:
        raise TypeError(f"plan(): unknown override(s) {sorted(unknown)}; "
                        f"choose from {_OVERRIDABLE + ('path',)}")
    dev = describe(device)
    dt = dtype_name(dtype)
    out = dtype_name(out_dtype if out_dtype is not None else dtype)
    if not overrides and epilogue == "none":  # autotuned choices, only when the user turned the cache on
        from jax_cluster import tuning_cache  # here: tuning_cache imports this module
        tuned = tuning_cache.plan_from_cache(m, n, k, dtype=dtype, out_dtype=out_dtype,
                                             batch=batch, a_major=a_major, b_major=b_major,
                                             device_info=dev)
        if tuned is not None:
            return tuned
    base = dict(m=int(m), n=int(n), k=int(k), batch=int(batch), dtype=dt, out_dtype=out,
                a_major=a_major, b_major=b_major, device=dev, epilogue=epilogue)

    def fallback(reason: str) -> Plan:
        return Plan(path="xla", reason=reason, **base)

    candidates, why = menu_rows(dev, "dense", dt, out, (m, n, k, batch), a_major, b_major,
                                overrides, "plan()", epilogue=epilogue)
    if why:
        return fallback(why)
    arch = dev.arch
    base_notes = []
    if not overrides.get("allow_nonportable_cluster", False):
        base_notes = [f"{v.name}: a {v.cluster_size}-CTA cluster is non-portable; pass "
                      "allow_nonportable_cluster=True to consider it"
                      for v in candidates if v.cluster_size > PORTABLE_CLUSTER_SIZE]
        candidates = [v for v in candidates if v.cluster_size <= PORTABLE_CLUSTER_SIZE]
    if not candidates:
        return dataclasses.replace(fallback("every matching variant needs a non-portable cluster "
                                            "(> 8 CTAs) and the caller did not opt in"),
                                   notes=tuple(base_notes))
    floor = memory_floor(m, n, k, batch, dt, out, dev)
    best, notes = None, list(base_notes)
    for v in candidates:
        clusters, residency = _resident_clusters(v, dev)
        if clusters < 1:  # step down: smaller clusters and 1-CTA rows stay candidates
            notes.append(f"{v.name}: no {v.cluster_m}x{v.cluster_n} cluster can be resident "
                         f"({residency}), not considered")
            continue
        raster, swizzle = _raster_and_swizzle(v, m, n, batch)
        raster = overrides.get("raster", raster)
        swizzle = int(overrides.get("swizzle", swizzle))
        row_memory_bound = _score(v, m, n, k, batch, clusters, "stream_k", swizzle)[0] < floor
        for schedule, splits in _candidate_schedules(v, k, row_memory_bound, overrides):
            time, waves, eff = _score(v, m, n, k, batch, clusters, schedule, swizzle, splits)
            memory = _memory_time(v, m, n, k, batch, clusters, schedule, swizzle, splits, floor, dev)
            key = (max(time, memory), time, schedule != "static")
            if best is None or key < best[0]:
                best = (key, v, clusters, residency, schedule, splits, raster, swizzle, waves, eff)
    if best is None:
        return dataclasses.replace(fallback(
            "no candidate variant fits on this device (cudaOccupancyMaxActiveClusters = 0)"),
            notes=tuple(notes))
    (total, compute, _), v, clusters, residency, schedule, splits, raster, swizzle, waves, eff = best
    memory_bound = total > compute
    if memory_bound:  # the MMAs wait on HBM for the rest
        eff *= compute / total
    plan = Plan(path="kernel", reason="", **base, variant=v.name, arch=arch, tile_m=v.tile_m,
                tile_n=v.tile_n, tile_k=v.tile_k, cluster_m=v.cluster_m, cluster_n=v.cluster_n,
                stages=v.stages, mma=v.mma, schedule=schedule, splits=splits,
                raster=raster, swizzle=swizzle,
                sm_count=int(dev.sm_count), max_active_clusters=int(clusters), residency=residency,
                waves=waves, predicted_efficiency=eff, memory_bound=memory_bound,
                notes=tuple(notes))
    split = f" x{splits} splits" if schedule == "split_k" else ""
    bound = ", memory-bound" if memory_bound else ""
    reason = (f"{v.name} fits: {waves:.2f} waves of {clusters} resident {v.cluster_m}x{v.cluster_n} "
              f"clusters, {schedule}{split} schedule{bound}, modelled efficiency {eff:.0%}")
    ws = _ffi.extension().workspace_size(plan.ffi_attrs(), plan.m, plan.n, plan.k, plan.batch)
    return dataclasses.replace(plan, reason=reason, workspace_bytes=int(ws))


def _matches(v: variants.Variant, overrides: dict) -> bool:
    if "variant" in overrides and v.name != overrides["variant"]:
        return False
    if "tile" in overrides and tuple(overrides["tile"]) != (v.tile_m, v.tile_n, v.tile_k):
        return False
    if "cluster" in overrides and tuple(overrides["cluster"]) != (v.cluster_m, v.cluster_n):
        return False
    return "schedule" not in overrides or overrides["schedule"] in v.schedules


def plan(m: int, n: int, k: int, *, dtype, out_dtype=None, batch: int = 1, device=None,
         a_major: str = "k", b_major: str = "n", **overrides) -> Plan:
    """The plan `jax_cluster.matmul` would use for A [M,K] @ B [K,N] (by default).

    `device` is a jax Device or a `DeviceInfo` (to plan for a GPU that is not
    present). Keyword overrides pin choices; see `plan_gemm`.
    """
    return plan_gemm(m, n, k, dtype=dtype, out_dtype=out_dtype, batch=batch, a_major=a_major,
                     b_major=b_major, device=device, **overrides)
