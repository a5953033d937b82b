"""The decode rows in the planner: what a decode plan says it does, where the
cost model sends calls, and the limits the kernel's group table sets."""

import dataclasses

import jax.numpy as jnp
import pytest

import jax_cluster
from jax_cluster import _ffi
from jax_cluster.planning import cost_model, tables
from jax_cluster.planning.device import DeviceInfo

H200 = DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132, 232448, 50 << 20)
DECODE = [v for v in tables.load_menu() if v.kind == "decode" and v.dtype == "bf16"]
FP8_DECODE = [v for v in tables.load_menu() if v.kind == "decode" and v.dtype in tables.BLOCK_SCALED_DTYPES]
needs_decode_rows = pytest.mark.skipif(
    not _ffi.with_kernels() or not {v.name for v in DECODE} & _ffi.compiled_variant_names(),
    reason="built without the decode rows",
)
needs_fp8_decode_rows = pytest.mark.skipif(
    not _ffi.with_kernels() or not {v.name for v in FP8_DECODE} & _ffi.compiled_variant_names(),
    reason="built without the block-scaled decode rows",
)


def _plan(m, n, k, groups, **kw):
    return jax_cluster.plan_ragged(m, n, k, groups, problem="ragged_m", dtype=jnp.bfloat16, device=H200, **kw)


def _fp8_plan(m, n, k, groups, **kw):
    return jax_cluster.plan_ragged(
        m, n, k, groups, problem="ragged_m", dtype="e4m3", out_dtype=jnp.bfloat16, b_major="k", device=H200, **kw
    )


def test_every_decode_row_is_a_kn_ragged_m_row_with_a_portable_cluster():
    assert DECODE
    for v in DECODE:
        assert (v.problem, v.a_major, v.b_major, v.schedules) == ("ragged_m", "k", "n", ("static",))
        assert v.tile_n == 256 and v.tile_m in (1, 2, 4, 8)  # a warp's 32 lanes x 8 columns; rows per item
        assert v.cluster_n == 1 and 1 <= v.cluster_m <= cost_model.PORTABLE_CLUSTER_SIZE


@needs_decode_rows
def test_a_decode_plan_explains_its_cluster_split_and_reduction():
    v = DECODE[-1]
    plan = _plan(8, 768, 2048, 128, variant=v.name)
    assert plan.variant == v.name
    text = plan.explain()
    assert f"clusters of {v.cluster_m} CTAs that split K" in text
    assert "distributed shared memory" in text or "DSMEM" in text
    assert "cluster barrier" in text and "no multicast" in text
    assert "work items" in text and "tile-times" not in text
    assert "the HBM floor over the modelled time" in text
    # bf16 rows: a step's 8 values of a row of A fill one 16-byte load, so few-row items read it in registers
    assert f"an item of up to {tables.DECODE_REGISTER_ROWS} rows is read in registers" in text
    assert f"rounded up to a multiple of {v.stages}" in text


@needs_decode_rows
def test_more_groups_than_the_kernel_table_holds_go_to_xla():
    groups = tables.DECODE_MAX_GROUPS + 1
    plan = _plan(64, 256, 256, groups, variant=DECODE[0].name)
    assert plan.path == "xla" and str(tables.DECODE_MAX_GROUPS) in plan.reason


def test_the_decode_model_streams_weights_and_counts_fmas():
    v = DECODE[-1]
    one_row = cost_model.decode_seconds(v, 8, 768, 2048, 128, 33, "bf16", "bf16", H200)
    double_k = cost_model.decode_seconds(v, 8, 768, 4096, 128, 33, "bf16", "bf16", H200)
    assert one_row > 0 and double_k > one_row
    # many rows per group: the CUDA cores' FMAs, not the stream, bound it
    training = cost_model.decode_seconds(v, 16384, 4096, 4096, 8, 33, "bf16", "bf16", H200)
    assert training > 2 * 16384 * 4096 * 4096 / 989e12 * 5
    assert cost_model.decode_items(v, 8, 768, 128) == 8 * 3
    assert cost_model.decode_items(v, 300, 264, 6) == 6 * 7 * 2


def test_decode_rows_take_calls_of_at_most_two_rows_per_group():
    # uniform routing: 8 of 128 groups receive rows, 64 rows fill about 50 of 128
    assert cost_model.decode_takes(8, 128) and cost_model.decode_takes(64, 128) and cost_model.decode_takes(2, 8)
    # Mixtral's 64 rows over 8 experts, OLMoE's 256 over 64: 8 and 4 rows per group
    assert not cost_model.decode_takes(64, 8) and not cost_model.decode_takes(256, 64)
    assert cost_model.expected_filled_groups(64, 64) == pytest.approx(64 * (1 - (63 / 64) ** 64))
    assert cost_model.expected_filled_groups(1, 128) == 1.0 and cost_model.expected_filled_groups(0, 8) == 0.0


@needs_decode_rows
@pytest.mark.parametrize("m, n, k, groups", [(8, 768, 2048, 128), (64, 1024, 2048, 64), (2, 14336, 4096, 8)])
def test_unpinned_few_row_calls_take_a_decode_row_and_say_why(m, n, k, groups):
    plan = _plan(m, n, k, groups)
    assert plan.kind == "decode", plan.reason
    assert any("so the CUDA-core decode rows run it" in note for note in plan.notes)


@needs_decode_rows
@pytest.mark.parametrize("m, n, k, groups", [(512, 14336, 4096, 8), (256, 1024, 2048, 64), (16384, 4096, 4096, 8)])
def test_calls_of_more_rows_per_group_keep_the_grouped_gemm(m, n, k, groups):
    plan = _plan(m, n, k, groups)
    assert plan.path == "kernel" and plan.kind != "decode", plan.variant
    if plan.memory_bound:  # compute-bound calls never consider the decode rows
        assert any("not the decode rows" in note for note in plan.notes)


def test_the_fitted_model_picks_the_measured_best_cluster():
    # the H200 decode run (decode_rows.json) at the resident clusters the GPU
    # reported: Mixtral and OLMoE fitted, Qwen3 held out
    resident = {2: 132, 4: 62, 8: 30}
    rows = {v.cluster_m: v for v in DECODE}

    def pick(m, n, k, groups):
        seconds = {
            c: cost_model.decode_seconds(v, m, n, k, groups, resident[c], "bf16", "bf16", H200) for c, v in rows.items()
        }
        return min(seconds, key=seconds.get)

    assert pick(8, 768, 2048, 128) == 8  # Qwen3-30B gate, 8 rows (held out): 12.5 us against 14.4 and 22.3
    assert pick(64, 768, 2048, 128) == 4  # Qwen3-30B gate, 64 rows (held out): 54.2 against 59.4 and 59.7
    assert pick(64, 1024, 2048, 64) == 4  # OLMoE gate, 64 rows: 57.4 against 63.6 and 65.8
    assert pick(2, 14336, 4096, 8) == 2  # Mixtral gate, 2 rows: 64.8 against 67.4 and 71.6


def test_every_block_scaled_decode_row_reads_k_major_weights_in_whole_scale_blocks():
    assert FP8_DECODE
    for v in FP8_DECODE:
        assert (v.problem, v.dtype, v.a_major, v.b_major, v.schedules) == ("ragged_m", "e4m3", "k", "k", ("static",))
        assert v.tile_k == tables.SCALE_BLOCK  # a K step is one scale block of a column
        assert v.tile_n % (4 * tables.DECODE_BLOCKWISE_WARPS) == 0  # four columns a warp step
        assert v.tile_m in (4, 8) and v.cluster_n == 1 and 1 <= v.cluster_m <= cost_model.PORTABLE_CLUSTER_SIZE
        # the bytes a CTA keeps in flight: stages blocks of each of its columns, one byte a value
        assert cost_model.bytes_in_flight(v, v.dtype) == v.stages * v.tile_n * tables.SCALE_BLOCK


@needs_fp8_decode_rows
def test_a_pinned_block_scaled_decode_plan_explains_its_scale_blocks():
    v = FP8_DECODE[0]
    plan = _fp8_plan(8, 768, 2048, 128, variant=v.name)
    assert plan.variant == v.name, plan.reason
    text = plan.explain()
    assert f"clusters of {v.cluster_m} CTAs that split K" in text
    assert "whole scale blocks of K" in text and "tile scales" in text and "block scale" in text
    assert f"each warp owns {v.tile_n // tables.DECODE_BLOCKWISE_WARPS} of them" in text


@needs_fp8_decode_rows
def test_unmeasured_block_scaled_decode_rows_stay_out_of_unpinned_plans():
    if all(v.validated for v in FP8_DECODE):
        pytest.skip("the block-scaled decode rows are measured and ranked")
    plan = _fp8_plan(8, 768, 2048, 128)
    assert plan.kind != "decode", plan.variant


def test_the_decode_model_streams_half_the_bytes_in_fp8():
    bf16, fp8 = DECODE[0], FP8_DECODE[0]
    # 2 rows on 8 experts of 14336 x 4096 (Mixtral's gate): the weight stream bounds both
    stream = cost_model.decode_seconds(bf16, 2, 14336, 4096, 8, 132, "bf16", "bf16", H200)
    half = cost_model.decode_seconds(fp8, 2, 14336, 4096, 8, 132, "e4m3", "bf16", H200)
    assert half < stream
    assert cost_model.decode_items(fp8, 8, 768, 128) == 8 * (768 // fp8.tile_n)


@needs_decode_rows
def test_a_call_that_only_decode_size_rows_could_take_says_so(monkeypatch):
    """With the training-size grouped rows out of the ranking, a compute-bound
    call has no row: XLA runs it, and the plan says why, not that nothing fits."""
    menu = tuple(
        dataclasses.replace(
            v, validated=v.validated and (v.kind == "decode" or v.tile_n <= cost_model.DECODE_TILE_N_MAX)
        )
        for v in tables.load_menu()
    )
    monkeypatch.setattr(tables, "load_menu", lambda *args: menu)
    plan = _plan(16384, 4096, 4096, 8)
    assert plan.path == "xla" and "decode-size calls only" in plan.reason, plan.reason
