"""The MoE MLP benchmark's harness on the CPU: its routing draws, and a smoke
run whose record has every field the results need (contenders that cannot
run are recorded with their error)."""

import importlib
import json
import pathlib
import sys

import numpy as np
import pytest

pytest.importorskip("flax")
BENCHMARKS = pathlib.Path(__file__).parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module("bench_moe_mlp")


@pytest.mark.parametrize("routing", ["uniform", "skewed", "one_hot"])
def test_each_token_gets_top_k_distinct_experts(bench, routing):
    experts_of = bench.assignment(routing, 512, 16, 4)
    assert experts_of.shape == (512, 4)
    assert all(len(set(row)) == 4 for row in experts_of.tolist())
    sizes = np.bincount(experts_of.reshape(-1), minlength=16)
    if routing == "uniform":
        assert sizes.tolist() == [128] * 16
    if routing == "one_hot":
        assert sizes[:4].tolist() == [512] * 4 and sizes[4:].sum() == 0
    if routing == "skewed":  # Dirichlet(0.5) shares: far from even, yet every row placed
        assert sizes.max() > 2 * 128 and sizes.sum() == 2048


def test_routed_inputs_match_the_layers_router(bench):
    experts_of = bench.assignment("skewed", 64, 8, 2)
    order, weights, sizes = bench.routed_inputs(experts_of, 8)
    flat = experts_of.reshape(-1)
    assert np.all(np.diff(flat[np.asarray(order)]) >= 0)  # rows sorted by expert
    assert np.asarray(sizes).tolist() == np.bincount(flat, minlength=8).tolist()
    np.testing.assert_allclose(np.asarray(weights).reshape(64, 2).sum(1), 1.0, rtol=1e-6)


def test_a_smoke_run_records_every_contender(bench, tmp_path):
    bench.main(["--smoke", "--out", str(tmp_path), "--routings", "skewed", "--configs", "smoke-a", "--iterations", "2"])
    payload = json.loads((tmp_path / "moe_mlp.json").read_text())
    (row,) = payload["rows"]
    for field in ("config", "tokens", "routing", "jc_ms", "tokamax_ms", "xla_ms", "torch_ms"):
        assert field in row
    assert row["router_included"] is False and row["jc_ms"] > 0
    assert row["jc_rel_err_vs_f32"] < 2e-2
    # where a contender has no time, it says why
    for name in ("tokamax", "xla", "torch", "jc_fused"):
        assert row[f"{name}_ms"] or row[f"{name}_error"]
    # the fused gate/up layer holds the same weights: the same outputs and gradients
    assert row["jc_fused_rel_err_vs_jc"] < 1e-2 and row["commit"]


def test_the_token_blocked_layer_is_the_same_function(bench, tmp_path):
    """--token-blocks: the layer routed in blocks of tokens ([S, E] sizes)
    gives the same outputs and gradients, and is timed."""
    args = ["--smoke", "--token-blocks", "4", "--routings", "skewed", "--configs", "smoke-a", "--iterations", "1"]
    bench.main([*args, "--out", str(tmp_path)])
    (row,) = json.loads((tmp_path / "moe_mlp.json").read_text())["rows"]
    assert row["token_blocks"] == 4 and row["jc_blocks_ms"] > 0 and row["jc_blocks_rel_err_vs_jc"] < 1e-2


@pytest.mark.parametrize("config", ["smoke-a", "smoke-c"])
def test_the_fp8_layer_is_timed_or_says_why_not(bench, tmp_path, config):
    bench.main(["--smoke", "--fp8", "--out", str(tmp_path), "--routings", "uniform", "--configs", config])
    (row,) = json.loads((tmp_path / "moe_mlp.json").read_text())["rows"]
    for key in ("jc_fp8", "jc_fp8_xla_weights"):  # the weights by the kernel where it runs, and by XLA's passes
        if config == "smoke-a":  # width 64: the recipe needs multiples of 128
            assert row[f"{key}_ms"] is None and "128" in row[f"{key}_error"]
        else:
            assert row[f"{key}_ms"] > 0 and row[f"{key}_rel_err_vs_jc"] < bench.MAX_FP8_REL_ERR


def test_a_resumed_run_keeps_every_earlier_row_and_measures_only_the_rest(bench, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    common = ["--smoke", "--routings", "skewed", "--iterations", "1"]
    bench.main([*common, "--out", str(first), "--configs", "smoke-a"])
    earlier = json.loads((first / "moe_mlp.json").read_text())["rows"][0]
    bench.main([*common, "--out", str(second), "--configs", "smoke-b", "--resume", str(first / "moe_mlp.json")])
    rows = json.loads((second / "moe_mlp.json").read_text())["rows"]
    assert [r["config"] for r in rows] == ["smoke-a", "smoke-b"]
    assert rows[0] == earlier  # kept as it was, not measured again


def test_accumulated_micro_batches_are_checked_and_timed(bench, tmp_path):
    """--micro-batches: the layer (and its fp8 recipe) accumulating a step's
    micro-batches in a scan agrees with their gradients summed one by one,
    and is timed per micro-batch."""
    args = ["--smoke", "--fp8", "--micro-batches", "3", "--routings", "skewed", "--configs", "smoke-c"]
    bench.main([*args, "--iterations", "1", "--out", str(tmp_path)])
    (row,) = json.loads((tmp_path / "moe_mlp.json").read_text())["rows"]
    assert row["micro_batches"] == 3
    for key in ("jc_accum", "jc_fp8_accum", "jc_fp8_accum_ahead"):
        assert row[f"{key}_ms"] > 0 and row[f"{key}_rel_err_vs_sum"] < 1e-2, row


def test_a_case_jax_cluster_cannot_run_is_recorded_and_the_run_goes_on(bench, tmp_path, monkeypatch):
    """A layer too large for the card (an out-of-memory error, say) is a row
    with its error; a wrong result still stops the run."""
    measure = bench.measure

    def too_large(cfg, *args, **kwargs):
        if cfg.name == "smoke-a":
            raise MemoryError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 7.00GiB")
        return measure(cfg, *args, **kwargs)

    asked = []  # the cases handed to XLA's experimental paths: only those jax_cluster ran
    monkeypatch.setattr(bench, "measure", too_large)
    monkeypatch.setattr(bench, "experimental_xla", lambda path, argv: asked.append(argv) or [])
    args = ["--smoke", "--routings", "skewed", "--configs", "smoke-a,smoke-b", "--iterations", "1"]
    bench.main([*args, "--experimental-xla", "--out", str(tmp_path)])
    payload = json.loads((tmp_path / "moe_mlp.json").read_text())
    failed, ran = payload["rows"]
    assert failed["jc_ms"] is None and "Out of memory" in failed["jc_error"]
    assert ran["config"] == "smoke-b" and ran["jc_ms"] > 0
    assert payload["summary"]["rows"] == 2 and payload["summary"]["rows_jax_cluster_could_not_run"] == 1
    assert asked and all(argv[argv.index("--configs") + 1] == "smoke-b" for argv in asked)
    for path in bench.XLA_PATHS:
        assert failed[f"{path}_ms"] is None and "did not run" in failed[f"{path}_error"]

    def wrong(*args, **kwargs):
        raise bench.WrongResult("off by 1e-1")

    monkeypatch.setattr(bench, "measure", wrong)
    with pytest.raises(bench.WrongResult):
        bench.main([*args, "--out", str(tmp_path / "again")])
