"""The measured routing of dense GEMMs between the kernel and XLA's dot, on
described devices: the shipped rule, the planner's use of it, and its fit."""

import dataclasses
import importlib.util
import json
import math
import pathlib

import jax
import jax.numpy as jnp
import pytest

import jax_cluster
from jax_cluster import _ffi
from jax_cluster.planning import routing
from jax_cluster.planning.call import Call
from jax_cluster.planning.device import DeviceInfo
from jax_cluster.primitives.gemm import gemm

needs_kernels = pytest.mark.skipif(not _ffi.with_kernels(), reason="built without kernels")
H200 = DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132, 232448, 60 << 20)
B200 = DeviceInfo("cuda", "NVIDIA B200", (10, 0), 148, 232448, 126 << 20)
FIT = pathlib.Path(__file__).parents[2] / "benchmarks" / "fit_routing.py"


def plan(m, n, k, device=H200, a_major="k", b_major="n", **overrides):
    overrides.setdefault("route", "measured")
    return jax_cluster.plan(m, n, k, dtype=jnp.bfloat16, device=device, a_major=a_major, b_major=b_major, **overrides)


def call(m, n, k, a_major="k", b_major="n"):
    return Call("dense", m, n, k, 1, a_major, b_major, "bf16", "bf16")


def test_the_shipped_table_covers_every_suite_layout_on_the_h200():
    entry = routing.rules_for(H200)
    assert entry is not None and "dense suite" in entry.evidence
    classes = {(r.layout, r.memory_bound) for r in entry.rules}
    assert classes == {(layout, bound) for layout in ("kn", "kk", "mn") for bound in (False, True)}
    assert all(r.lo <= r.hi for r in entry.rules)


def test_a_device_without_measurements_keeps_the_kernel():
    assert routing.rules_for(B200) is None
    assert routing.xla_is_faster(call(8192, 8192, 8192), False, B200) == ""
    # the name alone is not enough: the capability must match too
    assert routing.rules_for(dataclasses.replace(H200, compute_capability=(10, 0))) is None


@needs_kernels
def test_an_unmeasured_device_of_a_measured_capability_takes_its_rules_and_says_so():
    """An H100 (9.0, as the H200) routes as the H200 measured: XLA's dot where
    the kernel lost there, never the unmeasured kernel; the reason names
    whose measurements decided."""
    h100 = dataclasses.replace(H200, name="NVIDIA H100 80GB HBM3")
    assert routing.rules_for(h100) is routing.rules_for(H200)
    planned = plan(8192, 8192, 4096, device=h100)
    assert planned.path == "xla" and "takes the H200's" in planned.reason
    assert "takes" not in plan(8192, 8192, 4096).reason  # the H200's own
    table = routing.parse(
        {"devices": [{"name": n, "compute_capability": [9, 0], "evidence": n, "rules": []} for n in ("H200", "H100")]}
    )
    assert routing.rules_for(h100, table).name == "H100"  # a device's own entry comes first


def test_the_rule_keeps_the_kernel_inside_its_window_only():
    table = routing.parse(
        {
            "devices": [
                {
                    "name": "H200",
                    "compute_capability": [9, 0],
                    "evidence": "a test table",
                    "rules": [{"layout": "mn", "memory_bound": True, "kernel_log2_k": [0.0, 3.0]}],
                }
            ]
        }
    )
    assert routing.xla_is_faster(call(4096, 4096, 4, "m", "n"), True, H200, table) == ""
    why = routing.xla_is_faster(call(4096, 4096, 16, "m", "n"), True, H200, table)
    assert "K = 16" in why and "1 <= K < 8" in why and "a test table" in why
    # a class the table does not name keeps the kernel
    assert routing.xla_is_faster(call(4096, 4096, 16, "k", "n"), True, H200, table) == ""


@needs_kernels
def test_a_large_training_gemm_on_the_h200_runs_xlas_dot_and_says_why():
    p = plan(8192, 8192, 8192)
    assert p.path == "xla"
    assert "XLA's dot is expected faster" in p.reason and "route='kernel'" in p.reason
    assert "XLA's dot is expected faster" in p.explain()


@needs_kernels
def test_route_kernel_and_pinned_choices_keep_the_kernel():
    assert plan(8192, 8192, 8192, route="kernel").path == "kernel"
    assert plan(8192, 8192, 8192, tile=(128, 256, 64)).path == "kernel"
    assert plan(8192, 8192, 8192, schedule="dynamic").path == "kernel"
    with pytest.raises(ValueError, match="route must be"):
        plan(64, 64, 64, route="fastest")


@needs_kernels
def test_the_environment_sets_the_default_route(monkeypatch):
    monkeypatch.setenv(routing.ROUTE_ENV, "measured")
    assert jax_cluster.plan(8192, 8192, 8192, dtype=jnp.bfloat16, device=H200).path == "xla"
    monkeypatch.setenv(routing.ROUTE_ENV, "kernel")
    assert jax_cluster.plan(8192, 8192, 8192, dtype=jnp.bfloat16, device=H200).path == "kernel"
    monkeypatch.setenv(routing.ROUTE_ENV, "sometimes")
    with pytest.raises(ValueError, match="JAX_CLUSTER_ROUTE"):
        jax_cluster.plan(64, 64, 64, dtype=jnp.bfloat16, device=H200)


@needs_kernels
def test_a_single_token_weight_gradient_takes_xlas_padded_dot():
    # K = 1 (one token): the kernel ran 1.3-1.8x XLA's own K = 1 dot on the
    # H200, and XLA's dot of K padded to 2 ran 1.1-1.2x the kernel
    p = plan(4096, 14336, 1, a_major="m", b_major="n")
    assert p.path == "xla" and "K padded to 2" in p.explain(), p.reason
    assert plan(4096, 14336, 1, a_major="m", b_major="n", route="kernel").path == "kernel"


@needs_kernels
def test_the_fused_epilogue_is_routed_like_the_plain_gemm():
    # a Linear with bias and gelu loses to XLA's dot (which fuses them too) where the GEMM does
    for shape in ((8192, 8192, 8192), (512, 128, 64)):
        plain = jax_cluster.plan(*shape, dtype=jnp.bfloat16, device=H200, route="measured")
        fused = jax_cluster.plan(*shape, dtype=jnp.bfloat16, device=H200, route="measured", epilogue="bias_act")
        assert fused.path == plain.path == "xla", fused.reason
        assert "XLA's dot is expected faster" in fused.reason
    kept = jax_cluster.plan(8192, 8192, 8192, dtype=jnp.bfloat16, device=H200, route="kernel", epilogue="bias_act")
    assert kept.path == "kernel"


def _fit_module():
    spec = importlib.util.spec_from_file_location("fit_routing", FIT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(k, gain):
    return {"k": k, "kernel_ms": 1.0, "routed_xla_ms": gain}


def test_the_fit_opens_a_window_only_for_a_clear_gain():
    fit = _fit_module()
    # a 1.5x win at K=1 and losses elsewhere: the window holds K=1 alone
    lo, hi = fit.fit_class([_row(1, 1.5), _row(16, 0.8), _row(4096, 0.97)])
    assert lo == 0.0 and 0.0 < hi <= 4.0
    # wins of 1% (noise) never open one
    assert fit.fit_class([_row(64, 1.01), _row(4096, 1.01)]) == (0.0, 0.0)


def test_the_fit_reads_only_the_fitting_families(tmp_path, monkeypatch):
    fit = _fit_module()
    table = tmp_path / "routing.json"
    table.write_text(json.dumps({"devices": []}))
    monkeypatch.setattr(fit, "TABLE", table)
    rows = [
        dict(_row(1, 2.0), layout="mn", memory_bound=True, held_out=False),
        # a held-out row that would open a window for kn if it were read
        dict(_row(1, 2.0), layout="kn", memory_bound=True, held_out=True),
        dict(_row(1, 0.5), layout="kn", memory_bound=True, held_out=False),
    ]
    suite = tmp_path / "dense_suite.json"
    suite.write_text(json.dumps({"commit": "abc1234", "rows": rows}))
    monkeypatch.setattr("sys.argv", ["fit_routing.py", str(suite), "--device", "H200"])
    fit.main()
    (entry,) = json.loads(table.read_text())["devices"]
    rules = {(r["layout"], r["memory_bound"]): r["kernel_log2_k"] for r in entry["rules"]}
    assert rules[("kn", True)] == [0.0, 0.0]
    assert rules[("mn", True)][0] == 0.0 and rules[("mn", True)][1] > 0.0
    assert "abc1234" in entry["evidence"] and math.isclose(len(entry["rules"]), 2)


def test_the_score_rewrites_default_paths_from_both_measured_paths(tmp_path, monkeypatch):
    fit = _fit_module()
    table = tmp_path / "routing.json"
    table.write_text(json.dumps({"devices": []}))
    monkeypatch.setattr(fit, "TABLE", table)
    full = dict(m=4096, n=4096, memory_bound=True, xla_ms=2.0, reason="as run", path="kernel")
    rows = [
        # the kernel wins K = 1 in the fitting family; a held-out K = 1 row follows the rule
        dict(full, k=1, layout="mn", kernel_ms=1.0, routed_xla_ms=1.5, jc_ms=1.0, held_out=False),
        dict(full, k=1, layout="mn", kernel_ms=1.2, routed_xla_ms=1.1, jc_ms=1.2, held_out=True),
        # the kernel loses at K = 4096: the score sends the row to XLA's path
        dict(full, k=4096, layout="mn", kernel_ms=2.2, routed_xla_ms=2.0, jc_ms=2.2, held_out=False),
    ]
    suite = tmp_path / "dense_suite.json"
    suite.write_text(json.dumps({"commit": "abc1234", "device": "NVIDIA H200", "rows": rows}))
    monkeypatch.setattr("sys.argv", ["fit_routing.py", str(suite), "--device", "H200", "--score"])
    fit.main()
    scored = json.loads(suite.read_text())
    paths = [(r["path"], r["jc_ms"]) for r in scored["rows"]]
    assert paths == [("kernel", 1.0), ("kernel", 1.2), ("xla", 2.0)]
    assert "fitted after the run" in scored["scored_with"]
    assert scored["summary"]["kernel_rows"] == 2 and scored["summary"]["rows"] == 3


def test_the_suite_times_every_contender_in_alternating_order(monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_dense_suite", FIT.with_name("bench_dense_suite.py"))
    suite = importlib.util.module_from_spec(spec)
    monkeypatch.syspath_prepend(str(FIT.parent))
    spec.loader.exec_module(suite)
    order = []
    monkeypatch.setattr(suite.timing, "cupti_ms", lambda fn, args, iterations: order.append(fn()) or len(order))
    ms = suite.interleaved_ms({"a": lambda: "a", "b": lambda: "b", "c": lambda: "c"}, None, 1, 3)
    assert order == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert ms == {"a": 6, "b": 5, "c": 4}  # medians of (1, 6, 7), (2, 5, 8), (3, 4, 9)


def test_info_says_how_kernel_calls_run(monkeypatch):
    monkeypatch.setenv(routing.ROUTE_ENV, "measured")
    info = jax_cluster.info()
    assert info.route == "measured" and isinstance(info.command_buffers, bool)
    if info.with_kernels:
        assert "dense calls routed: measured" in str(info)


def _cuda_hlo(m, n, a_major, b_major, dtype=jnp.bfloat16):
    """The StableHLO of a K = 1 product on XLA's path, lowered for CUDA (no GPU needed)."""
    a = jnp.ones((m, 1) if a_major == "k" else (1, m), dtype)
    b = jnp.ones((n, 1) if b_major == "k" else (1, n), dtype)
    p = jax_cluster.plan(m, n, 1, dtype=dtype, a_major=a_major, b_major=b_major, path="xla")
    fn = jax.jit(lambda x, y: gemm(x, y, a_major=a_major, b_major=b_major, plan=p))
    return fn.trace(a, b).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("majors", [("m", "n"), ("k", "n"), ("k", "k")])  # dW of one token, outer product, kk
def test_xla_runs_a_large_k1_product_as_a_dot_of_k_padded_to_2(majors):
    text = _cuda_hlo(4096, 4096, *majors)
    assert text.count("stablehlo.pad") == 2
    assert "tensor<2x4096xbf16>" in text or "tensor<4096x2xbf16>" in text
    assert "stablehlo.dot_general" in text


def test_small_or_float32_k1_products_keep_xla_dot_as_it_is():
    assert "stablehlo.pad" not in _cuda_hlo(256, 256, "m", "n")
    assert "stablehlo.pad" not in _cuda_hlo(4096, 4096, "m", "n", jnp.float32)


def test_the_padded_form_computes_the_product_exactly():
    from jax_cluster.primitives.lowering import xla_gemm, xla_gemm_padded_k

    a = jax.random.normal(jax.random.key(0), (2, 1, 48)).astype(jnp.bfloat16)
    b = jax.random.normal(jax.random.key(1), (2, 1, 40)).astype(jnp.bfloat16)
    kw = dict(a_major="m", b_major="n", out_dtype=jnp.bfloat16, plan=None)
    padded, plain = xla_gemm_padded_k(a, b, **kw), xla_gemm(a, b, **kw)
    assert padded.shape == (2, 48, 40) and bool((padded == plain).all())


def test_explain_names_the_padded_form():
    p = plan(4096, 14336, 1, a_major="m", b_major="n", path="xla")
    assert "K padded to 2" in p.explain()
    assert "K padded to 2" not in plan(4096, 14336, 2, a_major="m", b_major="n", path="xla").explain()
