"""The tail simulator on cases small enough to work out by hand."""

import pytest

from jax_cluster.planning.schedule import compare, grouped_tile_costs, plot_timeline, simulate, uniform_tiles


def test_full_waves_are_perfect_under_every_schedule():
    sims = compare(uniform_tiles(8), 4, schedules=("static", "dynamic", "clc", "stream_k"))
    for sim in sims.values():
        assert sim.makespan == 2 and sim.tail_efficiency == 1.0 and sim.waves == 2
        assert sim.busy == (2, 2, 2, 2) and len(sim.segments) == 8


def test_partial_wave_idles_workers_except_under_stream_k():
    sims = compare(uniform_tiles(5), 4)
    for name in ("static", "dynamic"):
        assert sims[name].makespan == 2 and sims[name].tail_efficiency == 5 / 8
        assert sims[name].busy == (2, 1, 1, 1)
    sk = sims["stream_k"]
    assert sk.makespan == 1.25 and sk.tail_efficiency == 1.0 and sk.busy == (1.25,) * 4


def test_uneven_costs_static_versus_dynamic():
    costs = [4, 1, 1, 1, 1, 1, 1, 1]
    static = simulate(costs, 2, "static")
    assert static.busy == (7, 4) and static.makespan == 7 and static.tail_efficiency == 11 / 14
    # w0 holds tile 0 until t=4 while w1 runs tiles 1-4; at t=4 both are free
    # (tie -> w0 gets 5), then w1 gets 6 at t=4 and w0 gets 7 at t=5.
    dynamic = simulate(costs, 2, "dynamic")
    assert [s[0] for s in sorted(dynamic.segments, key=lambda s: s[3])] == [0, 1, 1, 1, 1, 0, 1, 0]
    assert dynamic.busy == (6, 5) and dynamic.makespan == 6 and dynamic.tail_efficiency == 11 / 12
    # Stream-K: 5.5 each; tile 2 = [5, 6) is split at 5.5, w1 finishes it and pays the fix-up.
    sk = simulate(costs, 2, "stream_k", fixup_cost=0.25)
    assert sk.busy == (5.5, 5.75) and sk.makespan == 5.75
    assert [s for s in sk.segments if s[3] == 2] == [(0, 5.0, 5.5, 2), (1, 0.0, 0.75, 2)]


def test_fetch_overhead_is_paid_for_every_tile_after_the_first():
    assert simulate(uniform_tiles(8), 4, "clc", fetch_overhead=0.1).makespan == pytest.approx(2.1)
    # One worker fetches tiles 1..4 itself.
    sim = simulate(uniform_tiles(5), 1, "dynamic", fetch_overhead=0.5)
    assert sim.makespan == 7 and sim.total_work == 5 and sim.tail_efficiency == 5 / 7
    # Static and stream-K fetch nothing.
    assert simulate(uniform_tiles(5), 1, "static", fetch_overhead=0.5).makespan == 5


def test_static_step_overhead_is_paid_for_every_tile_after_a_workers_first():
    # 2 workers, 5 tiles: w0 runs tiles 0, 2, 4 (two steps), w1 runs 1, 3 (one).
    sim = simulate(uniform_tiles(5), 2, "static", step_overhead=0.5)
    assert sim.busy == (4, 2.5) and sim.makespan == 4
    assert simulate(uniform_tiles(2), 2, "static", step_overhead=0.5).makespan == 1
    assert simulate(uniform_tiles(5), 1, "dynamic", step_overhead=0.5).makespan == 5


def test_stream_k_with_k_iterations_and_fixup():
    # T = 9 iterations, bounds 0, 2, 4, 6, 9: tile 0 (6 iters) is shared by
    # w0, w1, w2; w2 holds its last iterations and pays 2 fix-ups; w3 gets tile 1.
    sim = simulate([6, 3], 4, "stream_k", k_iters=[6, 3], fixup_cost=1.0)
    assert sim.busy == (2, 2, 4, 3) and sim.makespan == 4
    assert sim.total_work == 9 and sim.tail_efficiency == 9 / 16
    # Per-iteration costs differ between tiles: bounds 0, 3, 6, 9 over
    # iterations costing 1,1,1,1 | 1,1 | 2,2,2.
    sim = simulate([4, 2, 6], 3, "stream_k", k_iters=[4, 2, 3], fixup_cost=4.0)
    assert sim.busy == (3, 7, 6) and sim.makespan == 7


def test_zero_tiles_and_zero_cost():
    for name in ("static", "dynamic", "stream_k"):
        sim = simulate([], 4, name)
        assert sim.makespan == 0 and sim.tail_efficiency == 1.0 and sim.segments == ()
    assert simulate([0, 0, 1], 2, "stream_k").makespan == 0.5


def test_grouped_tile_costs():
    # 300 rows -> 3 M-tiles (the last one partial but full cost), 0 rows -> none,
    # 128 rows -> 1; each times ceil(512 / 256) = 2 N-tiles.
    costs = grouped_tile_costs([300, 0, 128], n=512, k=64, tile_m=128, tile_n=256)
    assert costs == [128 * 256 * 64.0] * 8
    assert grouped_tile_costs([0, 0], 512, 64, 128, 256) == []


@pytest.mark.parametrize(
    "args,kw,match",
    [
        (([1, 1], 0), {}, "workers"),
        (([1, -1], 2), {}, "finite and >= 0"),
        (([1, 1], 2, "round_robin"), {}, "static, stream_k, dynamic, clc"),
        (([1, 1], 2, "stream_k"), {"k_iters": [1]}, "k_iters has 1"),
        (([1, 1], 2, "stream_k"), {"k_iters": [1, 0]}, ">= 1"),
        (([1, 1], 2, "dynamic"), {"fetch_overhead": -1}, "fetch_overhead"),
        (([1, 1], 2, "static"), {"step_overhead": float("nan")}, "step_overhead"),
    ],
)
def test_bad_input_raises(args, kw, match):
    with pytest.raises(ValueError, match=match):
        simulate(*args, **kw)


def test_plot_timeline_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = plot_timeline(compare([4, 1, 1, 1, 1, 1, 1, 1], 2), tmp_path / "t.png", title="demo")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
