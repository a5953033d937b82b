"""The CUPTI timing helper's arithmetic, on recorded kernel runs (no GPU)."""

import pytest

from jax_cluster.tuning import timing


def test_kernel_listing_adds_up_to_the_timed_call(monkeypatch):
    profiler = pytest.importorskip("jax.experimental.mosaic.gpu.profiler")
    # three timed iterations of a program over two input sets: "gemm" runs twice per set
    runs = [
        [("gemm", 1.0), ("gemm", 2.0), ("fusion", 0.5), ("gemm", 1.0), ("gemm", 2.0), ("fusion", 0.5)],
        [("gemm", 1.2), ("gemm", 2.2), ("fusion", 0.4), ("gemm", 1.2), ("gemm", 2.2), ("fusion", 0.4)],
        [("gemm", 0.8), ("gemm", 1.8), ("fusion", 0.6), ("gemm", 0.8), ("gemm", 1.8), ("fusion", 0.6)],
    ]
    seen = {}

    def measure(fn, *, aggregate, iterations):
        seen.update(aggregate=aggregate, iterations=iterations)
        return lambda args_list: (None, runs)

    monkeypatch.setattr(profiler, "measure", measure)
    monkeypatch.setattr(timing, "_warm", lambda *a: None)
    call_ms, kernels = timing.cupti_kernels(lambda x: x, [(1,), (2,)], iterations=3)
    assert seen == dict(aggregate=False, iterations=3)
    # per-iteration sums 7.0, 7.6, 6.4 -> median 7.0 over 2 sets
    assert call_ms == pytest.approx(3.5)
    assert kernels == [("gemm", pytest.approx(3.0)), ("fusion", pytest.approx(0.5))]
    assert timing.cupti_ms(lambda x: x, [(1,), (2,)], iterations=3) == pytest.approx(3.5)


def test_no_kernels_is_an_error(monkeypatch):
    profiler = pytest.importorskip("jax.experimental.mosaic.gpu.profiler")
    monkeypatch.setattr(profiler, "measure", lambda fn, **kw: lambda args_list: (None, None))
    monkeypatch.setattr(timing, "_warm", lambda *a: None)
    with pytest.raises(RuntimeError, match="no kernel launches"):
        timing.cupti_kernels(lambda x: x, [(1,)], iterations=2)


def test_back_to_back_times_the_dispatch_and_the_span_of_one_sync(monkeypatch):
    """back_to_back_ms warms once, then times `calls` rotated calls with one
    sync, the clock read once before it: 10 calls of 2 sets enqueued in 4
    clock seconds and synced at 40 are 0.2 s and 2 s a call."""
    import jax.numpy as jnp

    clock = iter([100.0, 104.0, 140.0])
    synced = []
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(timing.jax, "block_until_ready", lambda outs: synced.append(len(outs)) or outs)
    x = jnp.ones(4)
    assert timing.back_to_back_ms(lambda v: v + 1, [(x,), (x,)], calls=10) == pytest.approx((200.0, 2000.0))
    assert synced == [2, 10]  # the warm-up call, then the timed calls once the dispatch was clocked


def test_iterations_are_batched_to_what_the_device_can_hold():
    gib = 1 << 30
    stats = {"bytes_limit": 140 * gib, "bytes_in_use": 60 * gib}
    # 80 GiB free: half of it holds one 22 GiB output, not ten
    assert timing.iterations_that_fit(22 * gib, stats, 10) == 1
    assert timing.iterations_that_fit(1 * gib, stats, 10) == 10
    assert timing.iterations_that_fit(9 * gib, stats, 10) == 4
    assert timing.iterations_that_fit(22 * gib, None, 10) == 10  # a device that does not say
    assert timing.iterations_that_fit(0, stats, 10) == 10


def test_a_batched_measurement_keeps_every_run(monkeypatch):
    profiler = pytest.importorskip("jax.experimental.mosaic.gpu.profiler")
    calls = []

    def measure(fn, *, aggregate, iterations):
        calls.append(iterations)
        one = [("gemm", float(len(calls)))]
        return lambda args_list: (None, one if iterations == 1 else [one] * iterations)

    monkeypatch.setattr(profiler, "measure", measure)
    monkeypatch.setattr(timing, "_warm", lambda *a: None)
    monkeypatch.setattr(timing, "iterations_that_fit", lambda out_bytes, stats, iterations: 2)
    call_ms, _ = timing.cupti_kernels(lambda x: x, [(1,)], iterations=5)
    assert calls == [2, 2, 1]
    assert call_ms == pytest.approx(2.0)  # runs 1, 1, 2, 2, 3
