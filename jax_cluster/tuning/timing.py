"""Time one jitted call on the GPU: CUPTI kernel time when present, else wall time.

Shared by `jax_cluster.tuning` and the benchmarks. Inputs rotate through
several sets inside one jit, so small problems are not timed out of a warm L2.
"""

from __future__ import annotations

import collections
import math
import statistics
import time

import jax

L2_FLUSH_BYTES = 256 << 20  # rotate inputs until they exceed every L2 by far


def rotation(bytes_per_set: int) -> int:
    """How many input sets to rotate through so they do not stay in L2."""
    return max(1, min(16, math.ceil(L2_FLUSH_BYTES / max(bytes_per_set, 1))))


def _rotated(fn):
    return jax.jit(lambda args_list: [fn(*args) for args in args_list])


def _warm(rotated, args_list, runs: int) -> None:
    for _ in range(runs):
        jax.block_until_ready(rotated(args_list))


def iterations_that_fit(out_bytes: int, memory_stats: dict | None, iterations: int) -> int:
    """How many iterations one CUPTI measurement can hold the outputs of in
    half the device's free memory (a large MoE layer's weight gradients take
    tens of GiB a call); all of them where the device does not say."""
    if not out_bytes or not memory_stats or "bytes_limit" not in memory_stats:
        return iterations
    free = memory_stats["bytes_limit"] - memory_stats.get("bytes_in_use", 0)
    return max(1, min(iterations, free // 2 // out_bytes))


def _output_bytes_and_memory(rotated, args_list):
    out_bytes = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(jax.eval_shape(rotated, args_list)))
    arrays = [a for a in jax.tree.leaves(args_list) if isinstance(a, jax.Array)]
    return out_bytes, (next(iter(arrays[0].devices())).memory_stats() if arrays else None)


def cupti_ms(fn, args_list, iterations: int = 10, warmup: int = 0) -> float:
    """Median kernel time of one call of `fn`, from CUPTI activity records.

    `profiler.measure` runs the call once untimed itself; `warmup` adds more.
    Raises ImportError or RuntimeError where CUPTI cannot be used.
    """
    return cupti_kernels(fn, args_list, iterations, warmup)[0]


def cupti_kernels(fn, args_list, iterations: int = 10, warmup: int = 0):
    """(median ms of one call, [(kernel name, median ms per call)], longest
    first), both from the same timed iterations, so the listing adds up to the
    time (up to the medians). A name that runs several times in a call is one
    entry with their sum."""
    from jax.experimental.mosaic.gpu import profiler

    rotated = _rotated(fn)
    _warm(rotated, args_list, warmup)
    runs, left = [], iterations
    batch = iterations_that_fit(*_output_bytes_and_memory(rotated, args_list), iterations)
    while left:  # profiler.measure keeps every iteration's outputs until it returns
        n = min(batch, left)
        _, got = profiler.measure(rotated, aggregate=False, iterations=n)(args_list)
        if not got:
            raise RuntimeError("CUPTI recorded no kernel launches")
        runs += [got] if n == 1 else got
        left -= n
    sets = len(args_list)
    per_name: dict[str, list[float]] = {}
    for run in runs:
        totals = collections.Counter()
        for name, ms in run:
            totals[name] += ms
        for name, ms in totals.items():
            per_name.setdefault(name, []).append(ms)
    call_ms = statistics.median(sum(ms for _, ms in run) for run in runs) / sets
    kernels = sorted(
        ((name, statistics.median(times) / sets) for name, times in per_name.items()), key=lambda item: -item[1]
    )
    return call_ms, kernels


def wall_ms(fn, args_list, iterations: int = 10, warmup: int = 1) -> float:
    """Median wall time of one call of `fn`, host launch overhead included."""
    rotated = _rotated(fn)
    _warm(rotated, args_list, max(1, warmup))  # at least the compile stays out of the timing
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        jax.block_until_ready(rotated(args_list))
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3 / len(args_list)


def back_to_back_ms(fn, args_list, calls: int = 20) -> tuple[float, float]:
    """(enqueue, span) ms per call of `fn` over `calls` back-to-back rotated
    calls synced once: the host's time to dispatch them, up to the sync, and
    the wall time through it (the device's span, gaps and host dispatch
    included, where `wall_ms` syncs after every call). An enqueue near the
    span means the host bounds the calls."""
    rotated = _rotated(fn)
    _warm(rotated, args_list, 1)
    start = time.perf_counter()
    outs = [rotated(args_list) for _ in range(calls)]
    enqueued = time.perf_counter()
    jax.block_until_ready(outs)
    done = time.perf_counter()
    per_call = 1e3 / calls / len(args_list)
    return (enqueued - start) * per_call, (done - start) * per_call


def span_ms(fn, args_list, calls: int = 20) -> float:
    """The span of back_to_back_ms."""
    return back_to_back_ms(fn, args_list, calls)[1]


def cupti_works(x) -> bool:
    """Whether CUPTI can time a call on `x`'s device (mosaic's GPU library and libcupti load)."""
    try:
        cupti_ms(lambda x: x + 1, [(x,)], iterations=1)
    except Exception:  # any failure to load or read CUPTI means: time by the wall clock
        return False
    return True
