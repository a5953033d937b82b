"""Autotuning: time candidate plans on the present GPU and keep the fastest.

    import jax_cluster
    jax_cluster.autotune([(4096, 4096, 4096), (128, 8192, 8192)])  # writes the cache
    jax_cluster.use_autotune_cache(True)    # or JAX_CLUSTER_AUTOTUNE=1: plans read it

The package exports this module's `autotune` and the cache's
`use_autotune_cache`. The cache (file, key, format, on/off) lives in
`jax_cluster.planning.autotune_cache`, below the primitives that read it.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import math
import os

import jax
import jax.numpy as jnp
import numpy as np

from jax_cluster.planning import autotune_cache, tables
from jax_cluster.planning.cost_model import SPLIT_K_MIN_K_TILES, SPLIT_K_SPLITS
from jax_cluster.planning.dense import plan_gemm
from jax_cluster.planning.device import DeviceInfo, describe
from jax_cluster.primitives.gemm import gemm
from jax_cluster.tuning import timing
from jax_cluster.tuning.accuracy import reference, relative_error, tolerance
from jax_cluster.tuning.progress import progress_bar
from jax_cluster.version import VERSION

XLA = {"path": "xla"}


@dataclasses.dataclass(frozen=True)
class Timing:
    overrides: dict
    ms: float | None  # None when the candidate failed
    error: str = ""


@dataclasses.dataclass(frozen=True)
class Result:
    """The outcome for one shape. `overrides` is the winner ({"path": "xla"} when
    XLA's dot won), None when every candidate failed."""

    key: str
    overrides: dict | None
    ms: float | None
    runner_up: dict | None
    runner_up_ms: float | None
    xla_ms: float | None
    timer: str  # "cupti" (kernel time) or "wall" (host clock)
    timings: tuple[Timing, ...]
    cache_file: str | None  # where the winner was written; None when not written

    @property
    def failed(self) -> tuple[Timing, ...]:
        return tuple(t for t in self.timings if t.ms is None)


def candidates(
    m: int, n: int, k: int, *, dtype, out_dtype=None, batch: int = 1, a_major="k", b_major="n", device=None
) -> list[dict]:
    """Every override dict worth timing for this problem, XLA's dot last.

    Each is a compiled menu variant the planner accepts for this device,
    dtypes and layouts, with one of its schedules (split_k with 2 and 4
    splits when K has enough k-tiles) and either raster. The swizzle the
    planner picks is pinned too, so a cached entry replays exactly what ran.
    """
    dev = describe(device)
    problem = dict(dtype=dtype, out_dtype=out_dtype, batch=batch, a_major=a_major, b_major=b_major, device=dev)
    found = []
    for v in tables.load_menu():
        if v.problem != "dense":
            continue
        for schedule in v.schedules:
            splits = [None]
            if schedule == "split_k":
                enough = math.ceil(k / v.tile_k) >= SPLIT_K_MIN_K_TILES
                splits = list(SPLIT_K_SPLITS) if enough else []
            for split in splits:
                for raster in ("along_m", "along_n"):
                    pinned = {"variant": v.name, "schedule": schedule, "raster": raster}
                    if split is not None:
                        pinned["splits"] = split
                    try:  # the planner's own filter: arch, compiled, dtypes, layouts, residency
                        plan = plan_gemm(m, n, k, **problem, **pinned)
                    except ValueError:
                        continue
                    if plan.uses_kernel:
                        found.append({**pinned, "swizzle": plan.swizzle})
    return found + [dict(XLA)]


def autotune(
    shapes,
    *,
    dtype=jnp.bfloat16,
    out_dtype=None,
    a_major: str = "k",
    b_major: str = "n",
    device=None,
    cache: bool = True,
    progress: bool = True,
    warmup: int = 1,
    iters: int = 10,
) -> dict[tuple, Result]:
    """Times every candidate plan for each shape on the present GPU.

    `shapes` holds (m, n, k) or (m, n, k, batch); the answer maps each shape,
    as a tuple, to its `Result`. Operands are A [M,K] ("k") or [K,M] ("m") and
    B [N,K] ("k") or [K,N] ("n"), with a leading batch when batch > 1, filled
    from a random normal. A candidate must match a float32 reference before
    it is timed; one that fails or raises is recorded, not fatal. Times are
    CUPTI kernel time when mosaic's profiler works here, else wall time
    (`Result.timer`). With `cache=True` each winner is written to the cache
    file (see `jax_cluster.tuning_cache`); planning reads it only once
    `jax_cluster.use_autotune_cache(True)` or JAX_CLUSTER_AUTOTUNE=1.
    """
    shapes = [tuple(shape) for shape in shapes]
    problems = [_problem(shape) for shape in shapes]
    jax_device, dev = _present_gpu(device)
    out_dtype = dtype if out_dtype is None else out_dtype
    lists = [
        candidates(m, n, k, dtype=dtype, out_dtype=out_dtype, batch=b, a_major=a_major, b_major=b_major, device=dev)
        for m, n, k, b in problems
    ]
    bar = progress_bar(sum(map(len, lists)), progress)
    root = jax.random.key(int.from_bytes(os.urandom(4), "little"))  # fresh inputs every run
    timer, results = None, {}
    try:
        for i, (shape, (m, n, k, b), cands) in enumerate(zip(shapes, problems, lists)):
            operands = _operands(
                jax.random.fold_in(root, i), m, n, k, b, dtype, out_dtype, a_major, b_major, jax_device
            )
            if timer is None:
                timer = "cupti" if timing.cupti_works(operands[0][0]) else "wall"
            ref = jax.jit(reference, static_argnums=(2, 3))(*operands[0], a_major, b_major)
            plan_args = dict(dtype=dtype, out_dtype=out_dtype, batch=b, a_major=a_major, b_major=b_major, device=dev)
            timings = []
            for pinned in cands:
                bar.set_description(f"{m}x{n}x{k}x{b} {label(pinned)}")
                timings.append(_time_candidate(pinned, (m, n, k), plan_args, operands, ref, timer, warmup, iters))
                bar.update(1)
            key = autotune_cache.cache_key(
                m, n, k, dtype=dtype, out_dtype=out_dtype, batch=b, a_major=a_major, b_major=b_major, device_info=dev
            )
            results[shape] = _result(key, timings, timer, cache, iters)
    finally:
        bar.close()
    return results


# --------------------------------------------------------------------------- helpers


def _present_gpu(device):
    """(jax Device, DeviceInfo) of the GPU to time on; RuntimeError without one."""
    if isinstance(device, DeviceInfo):
        raise RuntimeError(
            "jax_cluster.autotune times plans on a present GPU: pass a jax.Device (or nothing), not a DeviceInfo"
        )
    jax_device = device if device is not None else jax.devices()[0]
    dev = describe(jax_device)
    if dev.platform != "cuda":
        raise RuntimeError(
            f"jax_cluster.autotune needs a CUDA GPU to time plans on, but the "
            f"device is {dev.platform} ({dev.name or 'no name'}); install jax "
            "with CUDA support and run it on the GPU the plans are for"
        )
    return jax_device, dev


def _problem(shape) -> tuple[int, int, int, int]:
    dims = tuple(int(d) for d in shape)
    if len(dims) not in (3, 4) or min(dims) < 1:
        raise ValueError(
            f"jax_cluster.autotune: a shape is (m, n, k) or (m, n, k, batch) of positive sizes, got {shape!r}"
        )
    return dims if len(dims) == 4 else (*dims, 1)


def _operands(key, m, n, k, batch, dtype, out_dtype, a_major, b_major, jax_device):
    """Enough (A, B) sets of random normals to rotate past L2, on the device."""
    lead = (batch,) if batch > 1 else ()
    a_shape = (*lead, *((m, k) if a_major == "k" else (k, m)))
    b_shape = (*lead, *((n, k) if b_major == "k" else (k, n)))
    per_set = batch * ((m * k + k * n) * np.dtype(dtype).itemsize + m * n * np.dtype(out_dtype).itemsize)
    sets = []
    with jax.default_device(jax_device):
        for subkey in jax.random.split(key, timing.rotation(per_set)):
            ka, kb = jax.random.split(subkey)
            sets.append(
                (
                    jax.random.normal(ka, a_shape, jnp.float32).astype(dtype),
                    jax.random.normal(kb, b_shape, jnp.float32).astype(dtype),
                )
            )
    return sets


def _time_candidate(pinned, mnk, plan_args, operands, ref, timer, warmup, iters) -> Timing:
    try:
        plan = plan_gemm(*mnk, **pinned, **plan_args)
        fn = functools.partial(
            gemm, a_major=plan.a_major, b_major=plan.b_major, out_dtype=np.dtype(plan_args["out_dtype"]), plan=plan
        )
        err = float(relative_error(jax.jit(fn)(*operands[0]), ref))
        bound = tolerance(plan.out_dtype, plan.dtype)
        if not err <= bound:
            return Timing(pinned, None, f"wrong result: relative error {err:.1e} exceeds {bound:.0e}")
        measure = timing.cupti_ms if timer == "cupti" else timing.wall_ms
        return Timing(pinned, measure(fn, operands, iters, warmup=warmup))
    except Exception as exc:  # one broken candidate must not end the run
        return Timing(pinned, None, f"{type(exc).__name__}: {exc}"[:300])


def _result(key, timings, timer, cache, iters) -> Result:
    ranked = sorted((t for t in timings if t.ms is not None), key=lambda t: t.ms)
    xla = next((t.ms for t in timings if t.overrides == XLA), None)
    winner = ranked[0] if ranked else None
    runner_up = ranked[1] if len(ranked) > 1 else None
    cache_file = None
    if cache and winner is not None:
        entry = {
            "overrides": winner.overrides,
            "ms": winner.ms,
            "runner_up": runner_up.overrides if runner_up else None,
            "runner_up_ms": runner_up.ms if runner_up else None,
            "xla_ms": xla,
            "timer": timer,
            "iterations": iters,
            "candidates": len(timings),
            "failed": len(timings) - len(ranked),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "jax_cluster": VERSION,
            "jax": jax.__version__,
        }
        cache_file = str(autotune_cache.record(key, entry))
    return Result(
        key,
        winner.overrides if winner else None,
        winner.ms if winner else None,
        runner_up.overrides if runner_up else None,
        runner_up.ms if runner_up else None,
        xla,
        timer,
        tuple(timings),
        cache_file,
    )


def label(pinned: dict) -> str:
    if pinned.get("path") == "xla":
        return "XLA dot"
    split = f"/{pinned['splits']}" if "splits" in pinned else ""
    return " ".join(str(pinned.get(f, "")) for f in ("variant", "schedule", "raster")) + split
