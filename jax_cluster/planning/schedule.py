"""Tail simulator: how long persistent workers take to drain a list of tiles.

`simulate` replays one tile scheduler over per-tile costs (any time unit) and
reports the makespan and the tail efficiency, total work / (workers x
makespan). Costs may be uneven, e.g. grouped GEMM with unequal groups. The
model ignores memory contention and launch latency: it answers only "how
badly does the last wave leave workers idle" for each schedule.

Schedules:
  static     grid-stride: worker w runs tiles w, w+W, w+2W, ..., paying
             `step_overhead` for each step after its first tile.
  dynamic    Hopper's atomic work queue: worker w starts on tile w, then each
             later tile goes to the first worker to become free (ties: lowest
             id), which pays `fetch_overhead` for fetching it.
  clc        Blackwell's Cluster Launch Control; same model as dynamic.
  stream_k   the k-iterations of all tiles, laid end to end, are cut into W
             contiguous even ranges. A tile shared by several workers costs
             `fixup_cost` per extra sharer, charged to the worker holding its
             last iteration; waiting for the partials is not modelled.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import math
import operator
from fractions import Fraction

import numpy as np

from jax_cluster.planning import tables

# The contract's schedules but split-K, whose tail is a whole wave of equal
# tiles: nothing to simulate.
SCHEDULES = tuple(s for s in tables.SCHEDULES if s != "split_k")


@dataclasses.dataclass(frozen=True)
class Simulation:
    schedule: str
    workers: int
    makespan: float
    busy: tuple[float, ...]  # per worker, overheads included
    total_work: float  # sum of tile costs, overheads excluded
    tail_efficiency: float  # total_work / (workers * makespan)
    waves: float  # tiles / workers
    # (worker, start, end, tile_index); a segment includes the overhead
    # charged to that tile on that worker (fetch or fix-up).
    segments: tuple[tuple[int, float, float, int], ...]

    def summary(self) -> str:
        return (
            f"{self.schedule}: {self.waves:.2f} waves on {self.workers} workers, "
            f"makespan {self.makespan:.4g}, tail efficiency {self.tail_efficiency:.1%}"
        )


def simulate(
    tile_costs, workers, schedule="static", *, fetch_overhead=0.0, step_overhead=0.0, k_iters=None, fixup_cost=0.0
) -> Simulation:
    """Simulates `schedule` over `tile_costs` (one per tile, in linear walk order)
    on `workers` persistent workers (resident clusters).

    `step_overhead` applies to static, `fetch_overhead` to dynamic/clc, and
    `k_iters` (iterations per tile) and `fixup_cost` to stream_k. Without
    `k_iters`, stream-K splits the work evenly in cost units, as if it were
    continuous.
    """
    costs = _costs(tile_costs)
    workers = _count(workers, "workers")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    for name, value in (
        ("fetch_overhead", fetch_overhead),
        ("step_overhead", step_overhead),
        ("fixup_cost", fixup_cost),
    ):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if k_iters is not None:
        k_iters = [_count(k, "k_iters entries") for k in k_iters]
        if len(k_iters) != len(costs):
            raise ValueError(f"k_iters has {len(k_iters)} entries for {len(costs)} tiles")
        if any(k < 1 for k in k_iters):
            raise ValueError("every k_iters entry must be >= 1")

    if schedule == "static":
        segments = _static(costs, workers, step_overhead)
    elif schedule in ("dynamic", "clc"):
        segments = _dynamic(costs, workers, fetch_overhead)
    elif schedule == "stream_k":
        segments = _stream_k(costs, workers, k_iters, fixup_cost)
    else:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")

    busy = [0.0] * workers
    makespan = 0.0
    for w, start, end, _ in segments:
        busy[w] += end - start
        makespan = max(makespan, end)
    total = math.fsum(costs)
    return Simulation(
        schedule=schedule,
        workers=workers,
        makespan=makespan,
        busy=tuple(busy),
        total_work=total,
        tail_efficiency=total / (workers * makespan) if makespan > 0 else 1.0,
        waves=len(costs) / workers,
        segments=tuple(segments),
    )


def compare(tile_costs, workers, schedules=("static", "dynamic", "stream_k"), **kw):
    """{schedule: Simulation} for the same tiles, workers and options."""
    return {s: simulate(tile_costs, workers, s, **kw) for s in schedules}


def uniform_tiles(count, cost=1.0):
    return [float(cost)] * _count(count, "count")


def grouped_tile_costs(group_rows, n, k, tile_m, tile_n):
    """Tile costs of a grouped GEMM whose groups have `group_rows[g]` rows (ragged
    M) and share N and K, group-major. Each tile costs tile_m*tile_n*k, partial
    ones too: the MMA runs the full tile and masks only the store. Empty groups
    contribute no tiles.
    """
    for name, value in (("n", n), ("k", k), ("tile_m", tile_m), ("tile_n", tile_n)):
        if _count(value, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    rows = [_count(r, "group_rows entries") for r in group_rows]
    if any(r < 0 for r in rows):
        raise ValueError("group_rows entries must be >= 0")
    tile_cost = float(tile_m * tile_n * k)
    n_tiles = -(-n // tile_n)
    return [tile_cost] * sum(-(-r // tile_m) * n_tiles for r in rows)


def plot_timeline(sims, path, *, title=None):
    """Draws a Gantt chart PNG: one panel per Simulation (a Simulation, a list, or
    compare()'s dict), workers on y, time on x. Needs matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError("plot_timeline needs matplotlib: pip install matplotlib") from e
    if isinstance(sims, Simulation):
        sims = [sims]
    elif isinstance(sims, dict):
        sims = list(sims.values())
    if not sims:
        raise ValueError("plot_timeline needs at least one Simulation")

    # Figure + Agg canvas, not pyplot: leaves the caller's backend alone.
    height = sum(1.0 + 0.12 * min(s.workers, 64) for s in sims)
    fig = Figure(figsize=(10, max(2.5, height)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(sims), 1, sharex=True, squeeze=False)[:, 0]
    colours = ("tab:blue", "tab:orange")
    for ax, sim in zip(axes, sims):
        # Colours alternate along each worker's row (tile parity would not:
        # under grid-stride with even W, all of a worker's tiles share it).
        # One broken_barh call per (worker, colour) keeps thousands of bars fast.
        bars: dict[tuple[int, int], list[tuple[float, float]]] = {}
        count = [0] * sim.workers
        for w, start, end, _ in sorted(sim.segments, key=lambda s: (s[0], s[1])):
            bars.setdefault((w, count[w] % 2), []).append((start, end - start))
            count[w] += 1
        for (w, parity), spans in bars.items():
            ax.broken_barh(spans, (w - 0.4, 0.8), facecolors=colours[parity], edgecolor="white", linewidth=0.3)
        ax.axvline(sim.makespan, color="black", linestyle="--", linewidth=1)
        ax.set_ylim(sim.workers - 0.5, -0.5)
        ax.set_xlim(left=0)
        ax.set_ylabel("worker")
        ax.set_title(
            f"{sim.schedule}: makespan {sim.makespan:.4g}, tail efficiency {sim.tail_efficiency:.1%}",
            fontsize=10,
            loc="left",
        )
    axes[-1].set_xlabel("time")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def _costs(tile_costs):
    costs = [float(c) for c in np.asarray(tile_costs, dtype=float).ravel()]
    if any(not (math.isfinite(c) and c >= 0) for c in costs):
        raise ValueError("tile costs must be finite and >= 0")
    return costs


def _count(value, name):
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name}: expected an integer, got {value!r}") from None


def _static(costs, workers, step_overhead):
    clock = [0.0] * workers
    segments = []
    for i, c in enumerate(costs):
        w = i % workers
        cost = c + (step_overhead if i >= workers else 0.0)
        segments.append((w, clock[w], clock[w] + cost, i))
        clock[w] += cost
    return segments


def _dynamic(costs, workers, fetch_overhead):
    # The first W tiles are handed out at launch, so they fetch nothing.
    segments = [(w, 0.0, c, w) for w, c in enumerate(costs[:workers])]
    free = [(c, w) for w, c in enumerate(costs[:workers])]
    heapq.heapify(free)  # (free_at, worker): ties go to the lowest worker id
    for i in range(workers, len(costs)):
        at, w = heapq.heappop(free)
        end = at + fetch_overhead + costs[i]
        segments.append((w, at, end, i))
        heapq.heappush(free, (end, w))
    return segments


def _stream_k(costs, workers, k_iters, fixup_cost):
    # Positions along the global work sequence are exact (Fraction / int), so
    # rounding never invents a sliver of a tile on a neighbouring worker.
    if k_iters is None:
        lengths = [Fraction(c) for c in costs]
        unit_cost = [1.0] * len(costs)
        total = sum(lengths, Fraction(0))
        bounds = [total * w / workers for w in range(workers + 1)]
    else:
        lengths = k_iters
        unit_cost = [c / k for c, k in zip(costs, k_iters)]
        total = sum(k_iters)
        bounds = [w * total // workers for w in range(workers + 1)]

    clock = [0.0] * workers
    segments = []
    lo: Fraction | int = 0
    for i, (length, per) in enumerate(zip(lengths, unit_cost)):
        hi = lo + length
        # Workers whose range [bounds[w], bounds[w+1]) overlaps [lo, hi).
        w = max(0, bisect.bisect_right(bounds, lo) - 1)
        pieces = []
        while w < workers and bounds[w] < hi:
            share = min(hi, bounds[w + 1]) - max(lo, bounds[w])
            if share > 0:
                pieces.append((w, float(share) * per))
            w += 1
        for j, (w, share_cost) in enumerate(pieces):
            cost = share_cost + (fixup_cost * (len(pieces) - 1) if j == len(pieces) - 1 else 0)
            segments.append((w, clock[w], clock[w] + cost, i))
            clock[w] += cost
        lo = hi
    return segments
