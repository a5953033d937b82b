"""The decode rows in the planner: what a decode plan says it does, where the
cost model sends calls, and the limits the kernel's group table sets."""

import jax.numpy as jnp
import pytest

import jax_cluster
from jax_cluster import _ffi
from jax_cluster.planning import cost_model, tables
from jax_cluster.planning.device import DeviceInfo

H200 = DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132, 232448, 50 << 20)
DECODE = [v for v in tables.load_menu() if v.kind == "decode"]
needs_decode_rows = pytest.mark.skipif(
    not _ffi.with_kernels() or not {v.name for v in DECODE} & _ffi.compiled_variant_names(),
    reason="built without the decode rows",
)


def _plan(m, n, k, groups, **kw):
    return jax_cluster.plan_ragged(m, n, k, groups, problem="ragged_m", dtype=jnp.bfloat16, device=H200, **kw)


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


@needs_decode_rows
def test_more_groups_than_the_kernel_table_holds_go_to_xla():
    groups = tables.DECODE_MAX_GROUPS + 1
    plan = _plan(64, 256, 256, groups, variant=DECODE[0].name)
    assert plan.path == "xla" and str(tables.DECODE_MAX_GROUPS) in plan.reason


def test_the_decode_model_streams_weights_and_counts_fmas():
    v = DECODE[-1]
    one_row = cost_model.decode_seconds(v, 8, 768, 2048, 128, 33, "bf16", "bf16", H200)
    double_k = cost_model.decode_seconds(v, 8, 768, 4096, 128, 33, "bf16", "bf16", H200)
    assert one_row > cost_model.DECODE_FIXED_S and double_k > one_row
    # many rows per group: the CUDA cores' FMAs, not the stream, bound it
    training = cost_model.decode_seconds(v, 16384, 4096, 4096, 8, 33, "bf16", "bf16", H200)
    assert training > 2 * 16384 * 4096 * 4096 / 989e12 * 5
    assert cost_model.decode_items(v, 8, 768, 128) == 8 * 3
    assert cost_model.decode_items(v, 300, 264, 6) == 6 * 7 * 2
