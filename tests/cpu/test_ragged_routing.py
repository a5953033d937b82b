"""The measured routing of grouped products between the grouped kernel and
XLA's ragged_dot, on described devices: the model of XLA's dense expansion,
the rule, and the fit of its threshold."""

import importlib.util
import pathlib

import jax.numpy as jnp
import pytest

import jax_cluster
from jax_cluster import _ffi
from jax_cluster.planning import routing
from jax_cluster.planning.call import Call
from jax_cluster.planning.device import DeviceInfo

needs_kernels = pytest.mark.skipif(not _ffi.with_kernels(), reason="built without kernels")

H200 = DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132, 232448, 60 << 20)
BENCH = pathlib.Path(__file__).parents[2] / "benchmarks" / "bench_ragged_routing.py"


def table(threshold_us):
    return routing.parse(
        {
            "devices": [
                {
                    "name": "H200",
                    "compute_capability": [9, 0],
                    "evidence": "a test table",
                    "rules": [],
                    "grouped": {"xla_below_us": threshold_us, "evidence": "a test sweep"},
                }
            ]
        }
    )


def test_the_expansion_is_every_group_times_the_dense_product():
    _, peak, bandwidth = routing.cost_model.ridge(H200, "bf16")
    # compute-bound: 64 groups of a 4096 x 4096 x 4096 product
    big = Call("ragged_m", 4096, 4096, 4096, 64, "k", "n", "bf16", "bf16")
    assert routing.expansion_seconds(big, H200) == pytest.approx(2 * 64 * 4096**3 / peak)
    # memory-bound: one row against 8 experts' weights, all of which XLA reads
    decode = Call("ragged_m", 1, 14336, 4096, 8, "k", "n", "bf16", "bf16")
    moved = (4096 + 8 * 4096 * 14336) * 2 + 14336 * 2
    assert routing.expansion_seconds(decode, H200) == pytest.approx(moved / bandwidth)
    # the weight gradient writes G outputs
    wgrad = Call("ragged_k", 64, 128, 1024, 4, "m", "n", "bf16", "bf16")
    moved = (64 * 1024 + 1024 * 128) * 2 + 4 * 64 * 128 * 2
    expected = max(2 * 4 * 64 * 128 * 1024 / peak, moved / bandwidth)
    assert routing.expansion_seconds(wgrad, H200) == pytest.approx(expected)


def test_small_grouped_calls_go_to_xla_and_say_why():
    tiny = Call("ragged_m", 1024, 128, 64, 4, "k", "n", "bf16", "bf16")
    why = routing.xla_ragged_is_faster(tiny, H200, table(5.0))
    assert "XLA's ragged_dot is expected faster" in why and "a test sweep" in why and "route='kernel'" in why
    layer = Call("ragged_m", 65536, 2048, 7168, 256, "k", "n", "bf16", "bf16")
    assert routing.xla_ragged_is_faster(layer, H200, table(5.0)) == ""
    # a device entry without a grouped rule keeps the kernel
    bare = routing.parse(
        {"devices": [{"name": "H200", "compute_capability": [9, 0], "evidence": "dense only", "rules": []}]}
    )
    assert routing.xla_ragged_is_faster(tiny, H200, bare) == ""


H100 = DeviceInfo("cuda", "NVIDIA H100 80GB HBM3", (9, 0), 132, 232448, 50 << 20)


@pytest.mark.parametrize("dev", [H100, H200])
@pytest.mark.parametrize("m", [16, 24, 32, 64])
def test_few_wide_experts_all_filled_go_to_xla_and_say_why(dev, m):
    # Mixtral 8x7B's gate: every expert expected to receive rows, the expansion's FLOPs under its weight stream
    gate = Call("ragged_m", m, 14336, 4096, 8, "k", "n", "bf16", "bf16")
    why = routing.xla_ragged_is_faster(gate, dev, table(1.0))
    assert "expected to receive rows" in why and "weight stream" in why and "route='kernel'" in why


@pytest.mark.parametrize(
    "m, n, k, groups, b_major",
    [
        (8, 14336, 4096, 8, "n"),  # 2.7 of 8 experts expected empty: the kernels read only the filled ones
        (512, 14336, 4096, 8, "n"),  # the expansion's FLOPs outlast the weight stream
        (128, 1024, 2048, 64, "n"),  # OLMoE: 9 of 64 expected empty
        (256, 768, 2048, 128, "n"),  # Qwen3-30B-A3B: 17 of 128 expected empty
        (32, 14336, 4096, 8, "k"),  # weights read transposed
    ],
)
def test_calls_with_empty_groups_or_long_expansions_keep_the_kernel(m, n, k, groups, b_major):
    call = Call("ragged_m", m, n, k, groups, "k", b_major, "bf16", "bf16")
    assert routing.streams_like_a_read(call, H200) == ""
    assert routing.xla_ragged_is_faster(call, H200, table(1.0)) == ""


def test_weight_gradients_are_not_the_streamed_expansions():
    wgrad = Call("ragged_k", 4096, 14336, 32, 8, "m", "n", "bf16", "bf16")
    assert routing.streams_like_a_read(wgrad, H200) == ""


def test_the_fit_picks_the_threshold_that_separates_the_fitting_rows():
    spec = importlib.util.spec_from_file_location("bench_ragged_routing", BENCH)
    bench = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(bench)
    except ImportError as e:  # the benchmark imports the GPU-side helpers
        pytest.skip(f"benchmark not importable here: {e}")

    def row(expansion_us, kernel_ms, xla_ms, held_out=False):
        return dict(expansion_us=expansion_us, kernel_ms=kernel_ms, xla_ms=xla_ms, held_out=held_out)

    rows = [row(0.5, 0.010, 0.004), row(2.0, 0.012, 0.008), row(20.0, 0.030, 0.060), row(200.0, 0.2, 0.9)]
    rows.append(row(1.0, 0.001, 1.0, held_out=True))  # held out: never fitted on
    threshold, (gm, worst) = bench.fit(rows)
    assert 2.0 < threshold < 20.0
    assert worst == pytest.approx(1.0)
    # applying it: each row's default path and time, and the held-out summary
    payload = {"rows": rows}
    bench.apply(payload, threshold)
    assert [r["path"] for r in rows] == ["xla", "xla", "kernel", "kernel", "xla"]
    assert [r["jc_ms"] for r in rows] == [0.004, 0.008, 0.030, 0.2, 1.0]
    assert payload["summary"]["held_out_rows"] == 1 and payload["summary"]["xla_rows"] == 3
    assert payload["summary"]["min_speedup_vs_xla_held_out"] == pytest.approx(1.0)


def plan(m, n, k, groups, **overrides):
    overrides.setdefault("route", "measured")
    overrides.setdefault("problem", "ragged_m")
    return jax_cluster.plan_ragged(m, n, k, groups, dtype=jnp.bfloat16, device=H200, **overrides)


def test_the_shipped_table_has_a_grouped_threshold_on_the_h200():
    entry = routing.rules_for(H200)
    assert entry.grouped is not None and "grouped routing sweep" in entry.grouped.evidence
    assert 0 < entry.grouped.xla_below_seconds < 1e-4


@needs_kernels
def test_a_small_moe_layer_runs_xlas_ragged_dot_and_says_why():
    # train_block's small MoE layer: 1024 routed rows over 4 experts of 64 -> 128
    for problem, view in (("ragged_m", (1024, 128, 64)), ("ragged_k", (64, 128, 1024))):
        p = plan(*view, 4, problem=problem)
        assert p.path == "xla", p.reason
        assert "XLA's ragged_dot is expected faster" in p.reason and "route='kernel'" in p.reason
        assert "XLA's ragged_dot is expected faster" in p.explain()


@needs_kernels
def test_a_decode_batch_over_few_wide_experts_runs_xlas_ragged_dot_and_says_why():
    p = plan(32, 14336, 4096, 8)  # Mixtral 8x7B's gate, 16 tokens of top-2
    assert p.path == "xla" and "expected to receive rows" in p.reason, p.reason
    assert "weight stream" in p.explain()
    assert plan(32, 14336, 4096, 8, route="kernel").path == "kernel"


@needs_kernels
def test_route_kernel_pins_and_large_layers_keep_the_grouped_kernel():
    assert plan(1024, 128, 64, 4, route="kernel").path == "kernel"
    assert plan(1024, 128, 64, 4, tile=(128, 256, 64)).path == "kernel"
    assert plan(65536, 2048, 7168, 256).path == "kernel"  # DeepSeek-V3's gate
    assert plan(8, 14336, 4096, 8).path == "kernel"  # decode: XLA would read all eight experts
    with pytest.raises(ValueError, match="route must be"):
        plan(1024, 128, 64, 4, route="fastest")


def _ragged_result_types(fn, *args):
    """The result types of the ragged dots in `fn`'s lowering for a CUDA GPU."""
    import re

    import jax

    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    return [re.search(r"-> tensor<([^>]*)>", line).group(1) for line in text.splitlines() if "ragged_dot" in line]


def test_the_xla_path_on_a_gpu_is_lax_ragged_dots_own_form():
    """A grouped product on XLA's path asks for the output dtype, as
    lax.ragged_dot does (an fp32 result widens the dense expansion), in the
    forward and in both gradients; a dot product of the expansion stays wide."""
    import jax
    from jax import lax

    x, w = jnp.ones((1024, 64), jnp.bfloat16), jnp.ones((4, 64, 128), jnp.bfloat16)
    sizes = jnp.array([256] * 4, jnp.int32)
    ours = _ragged_result_types(lambda x, w: jax_cluster.ragged_dot(x, w, sizes, plan=None), x, w)
    assert ours == _ragged_result_types(lambda x, w: lax.ragged_dot(x, w, sizes), x, w) == ["1024x128xbf16"]

    def loss(x, w):
        return jax_cluster.ragged_dot(x, w, sizes).astype(jnp.float32).sum()

    grads = _ragged_result_types(jax.grad(loss, argnums=(0, 1)), x, w)
    assert sorted(grads) == ["1024x64xbf16", "4x64x128xbf16"]
    # one row against one output column: XLA would reduce in bf16
    one = _ragged_result_types(
        lambda x, w: jax_cluster.ragged_dot(x, w, jnp.array([1], jnp.int32)),
        jnp.ones((1, 64), jnp.bfloat16),
        jnp.ones((1, 64, 1), jnp.bfloat16),
    )
    assert one == ["1x1xf32"]
