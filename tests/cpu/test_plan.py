"""The planner's choices and explain(), on described (not present) devices."""

import dataclasses
import math

import jax.numpy as jnp
import pytest

import jax_cluster
from jax_cluster import _ffi
from jax_cluster.planning import tables
from jax_cluster.planning.device import DeviceInfo, arch_for_compute_capability
from jax_cluster.planning.plan import KERNEL_FIELDS

needs_kernels = pytest.mark.skipif(not _ffi.with_kernels(), reason="built without kernels")


def described(cc, sms=132):
    return DeviceInfo("cuda", f"described cc {cc}", cc, sms, 232448, 50 << 20)


H200 = described((9, 0))
B200 = described((10, 0), 148)
# named, so the roofline takes the H200's own HBM bandwidth (4.8 TB/s)
H200_NAMED = dataclasses.replace(H200, name="NVIDIA H200")


# family-specific sm_100f SASS runs on 10.0 and 10.3 (B200, B300); 12.x is another family
@pytest.mark.parametrize(
    "cc,arch",
    [
        ((9, 0), "sm90a"),
        ((10, 0), "sm100f"),
        ((10, 3), "sm100f"),
        ((8, 0), None),
        ((8, 9), None),
        ((12, 0), None),
        ((12, 1), None),
        ((9, 1), None),
    ],
)
def test_dispatch_table_by_compute_capability(cc, arch):
    assert arch_for_compute_capability(cc) == arch
    p = jax_cluster.plan(4096, 4096, 4096, dtype=jnp.bfloat16, device=described(cc))
    if arch is None:
        assert p.path == "xla" and "compute capability" in p.reason
    elif _ffi.with_kernels():
        assert p.path == "kernel" and p.arch == arch


def test_cpu_device_falls_back():
    p = jax_cluster.plan(64, 64, 64, dtype=jnp.bfloat16, device=DeviceInfo("cpu"))
    assert p.path == "xla" and "cpu" in p.reason


def test_a_device_named_by_a_string_is_a_clear_error():
    with pytest.raises(TypeError, match="jax Device or a jax_cluster.DeviceInfo"):
        jax_cluster.plan(64, 64, 64, dtype=jnp.bfloat16, device="h200")


@needs_kernels
def test_h200_plan_is_a_compiled_sm90_variant():
    p = jax_cluster.plan(8192, 8192, 8192, dtype=jnp.bfloat16, device=H200)
    menu = {v.name: v for v in tables.load_menu()}
    v = menu[p.variant]
    assert p.path == "kernel" and p.arch == "sm90a" == v.arch
    assert (p.tile_m, p.tile_n, p.tile_k, p.cluster_m, p.cluster_n, p.stages) == (
        v.tile_m,
        v.tile_n,
        v.tile_k,
        v.cluster_m,
        v.cluster_n,
        v.stages,
    )
    assert p.residency == "modelled" and p.max_active_clusters == 132 // v.cluster_size
    assert p.schedule in v.schedules and p.raster in ("along_m", "along_n")
    assert p.swizzle in (1, 2, 4, 8)


@needs_kernels
@pytest.mark.parametrize(
    "m,n,k,a_major,b_major,what",
    [
        (64, 64, 7, "k", "n", "A's K"),
        (64, 7, 64, "k", "n", "B's N"),
        (64, 60, 64, "k", "k", "the output's N"),
        (7, 64, 64, "m", "n", "A's M"),
    ],
)
def test_misaligned_problems_fall_back_with_reason(m, n, k, a_major, b_major, what):
    p = jax_cluster.plan(m, n, k, dtype=jnp.bfloat16, device=H200, a_major=a_major, b_major=b_major)
    assert p.path == "xla" and "16-byte" in p.reason and what in p.reason


@needs_kernels
def test_unsupported_dtype_combinations_fall_back():
    p = jax_cluster.plan(64, 64, 64, dtype=jnp.float32, device=H200)
    assert p.path == "xla" and "bf16 or f16" in p.reason
    p = jax_cluster.plan(64, 64, 64, dtype=jnp.bfloat16, out_dtype=jnp.float16, device=H200)
    assert p.path == "xla" and "not f16" in p.reason


@needs_kernels
def test_layout_without_a_variant_falls_back():
    p = jax_cluster.plan(64, 64, 64, dtype=jnp.bfloat16, device=H200, a_major="m", b_major="k")
    assert p.path == "xla" and "no compiled sm90a variant" in p.reason


@needs_kernels
def test_overrides_pin_choices():
    p = jax_cluster.plan(
        4096,
        4096,
        4096,
        dtype=jnp.bfloat16,
        device=H200,
        tile=(128, 128, 64),
        schedule="stream_k",
        swizzle=2,
        raster="along_m",
    )
    assert (p.tile_m, p.tile_n, p.schedule, p.swizzle, p.raster) == (128, 128, "stream_k", 2, "along_m")
    assert jax_cluster.plan(64, 64, 64, dtype=jnp.bfloat16, device=H200, path="xla").path == "xla"
    with pytest.raises(ValueError, match="no compiled variant matches"):
        jax_cluster.plan(64, 64, 64, dtype=jnp.bfloat16, device=H200, tile=(8, 8, 8))
    with pytest.raises(TypeError, match="unknown override"):
        jax_cluster.plan(64, 64, 64, dtype=jnp.bfloat16, device=H200, tiles=(8, 8, 8))


@needs_kernels
def test_few_waves_prefer_stream_k_or_smaller_tiles():
    # 1536 x 1536 in 128x256 tiles is 72 tiles for 66 clusters: a tail of one wave.
    p = jax_cluster.plan(1536, 1536, 32768, dtype=jnp.bfloat16, device=H200)
    assert p.schedule == "stream_k" or p.tile_n == 128
    assert p.predicted_efficiency > 0.8


@needs_kernels
@pytest.mark.parametrize(
    "m,n,schedule,swizzle",
    [
        (8192, 8192, "static", 8),
        (8448, 8448, "static", 1),
        (4352, 4352, "stream_k", 1),
        (8448, 8448, "dynamic", 8),
        (4352, 4352, "dynamic", 8),
    ],
)
def test_swizzle_never_pads_the_grid_much(m, n, schedule, swizzle):
    # CUTLASS rounds the tile grid up to swizzle x cluster and runs the padded
    # tiles: 8448^2 with swizzle 8 walked 47% extra tiles (0.61x XLA on the H200).
    # The work queue's banded walk pads nothing, so it keeps the wide swizzle.
    p = jax_cluster.plan(
        m, n, 4096, dtype=jnp.bfloat16, device=H200, schedule=schedule, tile=(128, 256, 64), cluster=(2, 1)
    )
    assert p.swizzle == swizzle
    if schedule == "dynamic":  # 2x1 clusters of 128x256 tiles, none padded, in bands of N
        assert p.raster == "along_m"
        assert p.waves * p.max_active_clusters == pytest.approx(math.ceil(m / 256) * math.ceil(n / 256))


@needs_kernels
def test_ffi_attrs_match_the_cpp_plan_struct():
    p = jax_cluster.plan(256, 256, 256, dtype=jnp.bfloat16, device=H200)
    assert tuple(_ffi.extension().plan_fields()) == KERNEL_FIELDS
    assert tuple(p.ffi_attrs()) == KERNEL_FIELDS
    assert {f.name for f in dataclasses.fields(p)} >= set(KERNEL_FIELDS)


@needs_kernels
def test_sm100_plans_use_2cta_umma():
    for b_major in ("k", "n"):
        p = jax_cluster.plan(8192, 8192, 8192, dtype=jnp.bfloat16, device=B200, b_major=b_major)
        assert p.path == "kernel" and p.arch == "sm100f" and p.mma == "2cta"
    p = jax_cluster.plan(8192, 8192, 8192, dtype=jnp.bfloat16, device=B200, schedule="clc")
    assert p.schedule == "clc" and "clc" in p.variant


@needs_kernels
def test_one_m_tile_takes_the_1x1_cluster_row():
    """M within one tile: a 2x1 cluster would pad M and halve the SMs that
    stream B, so the planner takes the 1x1 row; two M tiles keep the cluster."""
    small = jax_cluster.plan(16, 14336, 4096, dtype=jnp.bfloat16, device=H200)
    assert (small.cluster_m, small.cluster_n) == (1, 1) and small.max_active_clusters == 132
    assert "no cluster: nothing is multicast" in small.explain()
    wide = jax_cluster.plan(256, 28672, 8192, dtype=jnp.bfloat16, device=H200)
    assert (wide.cluster_m, wide.cluster_n) == (2, 1)


@needs_kernels
def test_residency_steps_down_then_falls_back():
    # three SMs: a 2x2 or 4x1 cluster cannot be resident, a 2x1 pair can
    p = jax_cluster.plan(4096, 4096, 4096, dtype=jnp.bfloat16, device=described((10, 0), 3))
    assert p.path == "kernel" and p.cluster_m * p.cluster_n <= 2
    assert any("c2x2" in note for note in p.notes) and any("c4x1" in note for note in p.notes)
    # one SM: only the 1-CTA rows remain
    p = jax_cluster.plan(4096, 4096, 4096, dtype=jnp.bfloat16, device=described((10, 0), 1))
    assert p.path == "kernel" and p.mma == "1cta" and (p.cluster_m, p.cluster_n) == (1, 1)
    # sm90 with one SM: bf16 steps down to its 1x1-cluster row; f16 has only
    # 2x1 clusters, so nothing fits and XLA runs it
    p = jax_cluster.plan(4096, 4096, 4096, dtype=jnp.bfloat16, device=described((9, 0), 1))
    assert p.path == "kernel" and (p.cluster_m, p.cluster_n) == (1, 1)
    assert any("c2x1" in note and "resident" in note for note in p.notes)
    p = jax_cluster.plan(4096, 4096, 4096, dtype=jnp.float16, device=described((9, 0), 1))
    assert p.path == "xla" and "fits" in p.reason and p.notes
    assert "note:" in p.explain()


def test_explain_has_five_parts():
    for dev in (H200, DeviceInfo("cpu")):
        text = jax_cluster.plan(4096, 4096, 4096, dtype=jnp.bfloat16, device=dev).explain()
        for i, part in enumerate(("Decision", "Evidence", "Contract", "Timeline", "Validation"), 1):
            assert f"{i}. {part}" in text


def test_info_reports_build_and_path():
    text = str(jax_cluster.info(device=H200))
    assert "kernels:" in text and "path" in text
    info = jax_cluster.info(device=DeviceInfo("cpu"))
    assert info.sample_path == "xla"


@needs_kernels
def test_many_wave_dense_plans_take_the_work_queue_where_a_row_has_one():
    menu = {v.name: v for v in tables.load_menu()}
    # 31 waves: each static step costs more than a fetch (STATIC_STEP_OVERHEAD)
    dyn = jax_cluster.plan(8192, 16384, 4096, dtype=jnp.bfloat16, device=H200)
    assert dyn.schedule == "dynamic" and menu[dyn.variant].kind == "cooperative_dynamic"
    assert "work queue" in dyn.explain() and "<- this plan" in dyn.explain()
    assert "per-tile handoff: static step" in dyn.explain()  # why dynamic, in the evidence
    assert "bands of 8 cluster tiles across N, walked along M" in dyn.explain()
    assert (
        "raster along_n, swizzle 8"
        in jax_cluster.plan(  # CUTLASS's own walk
            8192, 16384, 4096, dtype=jnp.bfloat16, device=H200, schedule="static"
        ).explain()
    )
    # no f16 row has a work queue; a pinned static schedule is kept
    assert jax_cluster.plan(8192, 16384, 4096, dtype=jnp.float16, device=H200).schedule == "static"
    pinned = jax_cluster.plan(8192, 16384, 4096, dtype=jnp.bfloat16, device=H200, schedule="static")
    assert pinned.schedule == "static" and menu[pinned.variant].kind == "cooperative"


@needs_kernels
def test_a_wave_or_less_takes_the_static_walk_and_its_single_launch():
    menu = {v.name: v for v in tables.load_menu()}
    # 2048^3: 64 cluster tiles of 256x256 over 66 resident 2x1 clusters; the
    # queue would balance nothing and its counter costs a fill before the launch
    one_wave = jax_cluster.plan(2048, 2048, 2048, dtype=jnp.bfloat16, device=H200, route="kernel")
    assert one_wave.schedule == "static" and menu[one_wave.variant].kind == "cooperative"
    assert "to zero the queue's counter" in one_wave.explain()
    # four waves: the queue's per-tile lead outweighs the reset
    four = jax_cluster.plan(4096, 4096, 4096, dtype=jnp.bfloat16, device=H200, route="kernel")
    assert four.schedule == "dynamic"
    pinned = jax_cluster.plan(2048, 2048, 2048, dtype=jnp.bfloat16, device=H200, route="kernel", schedule="dynamic")
    assert pinned.schedule == "dynamic" and menu[pinned.variant].kind == "cooperative_dynamic"


@needs_kernels
@pytest.mark.parametrize("tiles,clusters", [(1, 66), (65, 66), (66, 66), (67, 66), (131, 66), (500, 66), (7, 3)])
def test_planner_makespan_matches_the_simulator(tiles, clusters):
    from jax_cluster.planning.cost_model import DYNAMIC_FETCH_OVERHEAD, STATIC_STEP_OVERHEAD, score
    from jax_cluster.planning.schedule import simulate, uniform_tiles

    v = next(v for v in tables.load_menu() if v.kind == "cooperative_dynamic")
    m = v.cta_tile_m * v.cluster_m

    def modelled(n_tiles, schedule):
        return score(v, m, v.tile_n * n_tiles, 4096, 1, clusters, schedule, 1)[0]

    one_tile = modelled(1, "static")
    for schedule in ("static", "dynamic"):
        sim = simulate(
            uniform_tiles(tiles),
            clusters,
            schedule,
            fetch_overhead=DYNAMIC_FETCH_OVERHEAD,
            step_overhead=STATIC_STEP_OVERHEAD,
        )
        assert modelled(tiles, schedule) / one_tile == pytest.approx(sim.makespan)


@needs_kernels
def test_non_portable_clusters_need_an_opt_in(monkeypatch):
    big = dataclasses.replace(
        next(v for v in tables.load_menu() if v.arch == "sm100f" and v.problem == "dense"), cluster_m=4, cluster_n=4
    )
    menu = tables.load_menu() + (big,)
    monkeypatch.setattr(tables, "load_menu", lambda: menu)
    monkeypatch.setattr(_ffi, "compiled_variant_names", lambda: frozenset(v.name for v in menu))
    args = dict(dtype=jnp.bfloat16, device=B200, a_major=big.a_major, b_major=big.b_major)
    p = jax_cluster.plan(8192, 8192, 8192, **args)
    assert p.variant != big.name and any("non-portable" in n for n in p.notes)
    pinned = jax_cluster.plan(8192, 8192, 8192, variant=big.name, **args)
    assert pinned.path == "xla" and "opt in" in pinned.reason


@pytest.mark.parametrize(
    "m,n,k,bound",
    [(8192, 8192, 8192, "compute-bound"), (16, 14336, 4096, "memory-bound"), (128, 8192, 8192, "memory-bound")],
)
def test_explain_places_the_problem_against_the_ridge_point(m, n, k, bound):
    from jax_cluster.planning import cost_model

    h200 = dataclasses.replace(H200, name="NVIDIA H200")
    point, peak, bandwidth = cost_model.ridge(h200)
    assert bandwidth == 4.8e12 and point == pytest.approx(peak / 4.8e12)
    # hand-computed: 16x14336x4096 bf16 moves (16*4096 + 4096*14336 + 16*14336) * 2 bytes
    if m == 16:
        assert cost_model.intensity(m, n, k, 1, 2, 2) == pytest.approx(
            2 * 16 * 14336 * 4096 / ((16 * 4096 + 4096 * 14336 + 16 * 14336) * 2)
        )
    text = jax_cluster.plan(m, n, k, dtype=jnp.bfloat16, device=h200).explain()
    assert f"{bound}" in text and "ridge point" in text and "modelled" in text


@needs_kernels
@pytest.mark.parametrize("device,arch", [(H200, "sm90a"), (B200, "sm100f")])
def test_fused_epilogue_plans_take_only_bias_act_rows(device, arch):
    args = dict(dtype=jnp.bfloat16, device=device, b_major="n")
    fused = jax_cluster.plan(4096, 4096, 4096, epilogue="bias_act", **args)
    plain = jax_cluster.plan(4096, 4096, 4096, **args)
    assert fused.path == "kernel" and fused.arch == arch and fused.variant.endswith("_bias_act")
    assert plain.path == "kernel" and not plain.variant.endswith("_bias_act")
    text = fused.explain()
    assert "fused into its epilogue" in text and "act(alpha*acc + beta*C + bias[n])" in text
    # no fused row for A stored [K,M]: the call falls back and says why
    moved = jax_cluster.plan(4096, 4096, 4096, epilogue="bias_act", a_major="m", **args)
    assert moved.path == "xla" and "bias_act" in moved.reason


@needs_kernels
@pytest.mark.parametrize(
    "m,n,k,tile_m,schedule,splits",
    [(16, 14336, 4096, 32, "stream_k", 1), (64, 4096, 4096, 32, "split_k", 2), (128, 8192, 8192, 64, "static", 1)],
)
def test_small_m_plans_take_the_swapped_row_as_measured(m, n, k, tile_m, schedule, splits):
    """The fastest menu candidates in bench_planner on the H200
    (benchmarks/results/h200/planner_vs_exhaustive.json)."""
    p = jax_cluster.plan(m, n, k, dtype=jnp.bfloat16, device=H200_NAMED)
    assert p.variant.endswith("_swapab") and (p.tile_m, p.tile_n) == (tile_m, 128)
    assert (p.schedule, p.splits) == (schedule, splits) and "memory-bound" in p.reason
    text = p.explain()
    assert "operands swapped" in text and "HBM floor" in text and "memory-bound: the makespans" in text
    # compute-bound shapes keep the 128x256 tiles
    assert jax_cluster.plan(4096, 4096, 4096, dtype=jnp.bfloat16, device=H200_NAMED).tile_m == 128


@needs_kernels
def test_pinned_splits_mean_split_k():
    p = jax_cluster.plan(64, 4096, 4096, dtype=jnp.bfloat16, device=H200_NAMED, splits=2)
    assert (p.schedule, p.splits) == ("split_k", 2)


def test_memory_time_by_hand():
    from jax_cluster.planning.cost_model import memory_floor, memory_time

    (v,) = [v for v in tables.load_menu() if v.swap_ab and v.tile_m == 64]
    m, n, k = 64, 4096, 4096
    moved = (m + n) * k * 2 + m * n * 2
    floor = memory_floor(m, n, k, 1, "bf16", "bf16", H200_NAMED)
    # seconds of HBM traffic, in the per-SM compute time of one output element over K
    assert floor == pytest.approx(moved / 4.8e12 * (989e12 / 132) / (2 * k))

    def memory(schedule, splits=1):
        return memory_time(v, m, n, k, 1, 132, schedule, 1, splits, floor, H200_NAMED)

    tile = 64 * 128 * 8  # a partial tile: fp32 out to the workspace and back
    # 32 whole tiles: 32 of 132 SMs stream, 0.95 * 132 are needed to saturate HBM
    assert memory("static") == pytest.approx(floor * 0.95 * 132 / 32)
    # split-K 4: 128 units in one wave, 3 partials per tile
    assert memory("split_k", 4) == pytest.approx(floor * (1 + 32 * 3 * tile / moved))
    # stream-K: every SM streams, about one partial each
    assert memory("stream_k") == pytest.approx(floor * (1 + 132 * tile / moved))
    assert memory_floor(m, n, k, 1, "bf16", "bf16", DeviceInfo("cpu")) == 0.0
