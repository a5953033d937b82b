"""Plan.explain() never contradicts itself: a fallback shows no kernel
evidence, the stream-K prediction appears only where the variant runs
stream-K, and every efficiency figure says what it measures."""

import jax.numpy as jnp
import pytest

import jax_cluster
from jax_cluster import _ffi
from jax_cluster.planning.device import DeviceInfo

H200 = DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132, 232448, 50 << 20)
needs_kernels = pytest.mark.skipif(not _ffi.with_kernels(), reason="built without kernels: no menu to plan from")


def explain(m, n, k, **kw):
    return jax_cluster.plan(m, n, k, dtype=jnp.bfloat16, device=H200, **kw).explain()


@pytest.mark.parametrize(
    "call",
    [dict(m=8192, n=8190, k=8190), dict(m=4096, n=4096, k=4096, path="xla")],
    ids=["misaligned", "asked"],
)
def test_a_fallback_plan_shows_no_kernel_evidence(call):
    text = jax_cluster.plan(**call, dtype=jnp.bfloat16, device=H200).explain()
    assert "Use XLA's dot" in text
    for kernel_only in ("HBM floor", "resident clusters", "waves", "prediction", "efficiency"):
        assert kernel_only not in text


def test_a_cpu_plan_says_the_device_plainly():
    text = jax_cluster.plan(64, 64, 64, dtype=jnp.bfloat16, device=DeviceInfo("cpu")).explain()
    assert "device: CPU" in text and "None" not in text


@needs_kernels
def test_the_stream_k_prediction_only_where_the_kind_runs_it():
    dynamic = jax_cluster.plan(8192, 8192, 8192, dtype=jnp.bfloat16, device=H200)
    assert dynamic.schedule == "dynamic" and "stream_k beats static" not in dynamic.explain()
    pinned = jax_cluster.plan(4096, 4096, 4096, dtype=jnp.bfloat16, device=H200, schedule="static")
    assert "stream_k" in pinned.explain().split("5. Validation")[1]


@needs_kernels
def test_every_efficiency_names_what_it_measures():
    text = explain(8192, 8192, 8192)
    lines = [line for line in text.splitlines() if "efficiency" in line]
    assert lines and all("(" in line.split("efficiency", 1)[1] for line in lines)
    assert all("makespan" in line or "work over workers" in line for line in lines)
    assert "(not a schedule of this kind)" in text  # the simulator's other rows say they are hypothetical


@needs_kernels
def test_a_static_cluster_grouped_row_runs_only_pinned_and_says_how_it_schedules():
    # Mixtral 8x22B's gate: 16384 rows over 8 experts, 6144 -> 16384
    args = dict(groups=8, problem="ragged_m", dtype=jnp.bfloat16, b_major="n", device=H200)
    default = jax_cluster.plan_ragged(16384, 16384, 6144, **args)
    assert default.kind != "grouped_static"
    name = "sm90_grouped_gemm_ragged_m_bf16_bf16_kn_128x256x64_c1x2_s4_grouped_static"
    pinned = jax_cluster.plan_ragged(16384, 16384, 6144, variant=name, **args)
    text = pinned.explain()
    assert pinned.variant == name and pinned.schedule == "static" and (pinned.cluster_m, pinned.cluster_n) == (1, 2)
    assert "A tiles are multicast by TMA to the 2 CTAs along N" in text
    assert "static: cluster c of the" in text and "takes the next tile" not in text
