"""The decode benchmark's harness on the CPU: its routing draw, the bytes its
roofline counts (weights of non-empty groups only), and a smoke run's record."""

import importlib
import importlib.util
import json
import pathlib
import sys

import numpy as np
import pytest

BENCHMARKS = pathlib.Path(__file__).parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module("bench_ragged_decode")


def test_sizes_spread_tokens_over_distinct_experts(bench):
    sizes = bench.case_sizes(64, 16, 4)
    assert sizes.sum() == 64 and sizes.max() <= 16  # each of 16 tokens takes an expert once at most
    assert bench.case_sizes(1, 256, 8).sum() == 8  # one token, top_k rows


def test_only_non_empty_groups_move_their_weights(bench):
    sizes = np.array([3, 0, 0, 1], np.int32)
    k, n = 128, 64
    assert bench.moved_bytes(sizes, k, n, 2) == 2 * (4 * k + 2 * k * n + 4 * n)


def test_a_smoke_run_records_the_roofline_and_every_contender(bench, tmp_path):
    bench.main(["--smoke", "--rows", "8", "--iterations", "2", "--out", str(tmp_path)])
    payload = json.loads((tmp_path / "ragged_decode.json").read_text())
    assert len(payload["rows"]) == len(bench.SMOKE)
    assert payload["summary"]["cases_a_read_keeps_below_85pct"] <= len(bench.SMOKE)
    for row in payload["rows"]:
        assert row["roofline_ms"] > 0 and row["jc_ms"] > 0 and row["jc_share_of_roofline"] > 0
        # a plain read of the same bytes, timed beside the contenders
        assert row["read_ms"] > 0 and row["read_share_of_roofline"] == row["roofline_ms"] / row["read_ms"]
        for name in ("jc_narrow", "tokamax", "xla"):
            assert row[f"{name}_ms"] or row[f"{name}_error"]


def test_a_run_without_the_planned_side_still_writes_its_plot(bench, tmp_path):
    # --contenders may leave out "jc" (the pinned rows alone): the plot marks its bars missing
    bench.main(["--smoke", "--rows", "8", "--iterations", "2", "--contenders", "^xla$", "--out", str(tmp_path)])
    payload = json.loads((tmp_path / "ragged_decode.json").read_text())
    assert all("jc_ms" not in row and row["xla_ms"] > 0 for row in payload["rows"])
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "ragged_decode.png").stat().st_size > 0


def test_the_plot_falls_back_to_the_fastest_pinned_row(bench):
    assert bench.jax_cluster_ms({"jc_ms": 0.3, "jc_decode2_ms": 0.1}) == 0.3
    assert bench.jax_cluster_ms({"jc_decode2_ms": 0.2, "jc_decode4_ms": 0.1, "jc_bf16_ms": 0.05}) == 0.1
    assert bench.jax_cluster_ms({"jc_narrow_ms": None, "xla_ms": 0.1}) is None


def test_resume_keeps_the_other_cases_and_layers_filters(bench, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    bench.main(["--smoke", "--rows", "8", "--iterations", "1", "--out", str(first)])
    earlier = json.loads((first / "ragged_decode.json").read_text())
    bench.main(
        ["--smoke", "--rows", "8", "--iterations", "1", "--layers", "down", "--out", str(second)]
        + ["--resume", str(first / "ragged_decode.json")]
    )
    payload = json.loads((second / "ragged_decode.json").read_text())
    assert [r["config"] for r in payload["rows"]] == [r["config"] for r in earlier["rows"]]
    gate = next(r for r in payload["rows"] if r["config"] == "smoke gate")
    assert gate == next(r for r in earlier["rows"] if r["config"] == "smoke gate")  # kept as it was
    assert all(r["commit"] for r in payload["rows"]) and "jc_tile_n" in payload["rows"][1]


def test_contenders_limits_the_timed_sides(bench, tmp_path):
    bench.main(["--smoke", "--rows", "8", "--iterations", "1", "--contenders", "^(jc|xla)$", "--out", str(tmp_path)])
    for row in json.loads((tmp_path / "ragged_decode.json").read_text())["rows"]:
        assert row["jc_ms"] > 0 and row["xla_ms"] > 0
        assert "tokamax_ms" not in row and "jc_narrow_ms" not in row


def test_rows_that_name_the_same_case_run_once(bench, capsys):
    # below top_k rows a case is one token: 1, 2 and 4 rows of a top-4 layer are the same case
    bench.main(["--smoke", "--layers", "down", "--rows", "1,2,4,8", "--list"])
    assert capsys.readouterr().out.strip().endswith("2 cases")


def test_fp8_bytes_are_one_a_value_with_the_block_scales(bench):
    sizes = np.array([3, 0, 1], np.int32)
    k, n = 256, 128
    values = 4 * k + 2 * k * n
    scales = 4 * (4 * 2 + 2 * 2 * 1)
    assert bench.moved_bytes_fp8(sizes, k, n) == values + scales + 2 * 4 * n


def test_an_fp8_smoke_run_records_every_contender(bench, tmp_path):
    bench.main(["--smoke", "--fp8", "--rows", "8", "--iterations", "1", "--out", str(tmp_path)])
    payload = json.loads((tmp_path / "ragged_decode_fp8.json").read_text())
    assert payload["operands"].startswith("e4m3") and len(payload["rows"]) == len(bench.SMOKE_FP8)
    for row in payload["rows"]:
        assert row["jc_ms"] > 0 and row["jc_bf16_ms"] > 0 and row["jc_vs_bf16"] > 0
        sizes = bench.case_sizes(8, row["experts"], row["top_k"])
        assert row["bytes"] == bench.moved_bytes_fp8(sizes, row["k"], row["n"])
        for name in ("tokamax", "xla"):
            assert row[f"{name}_ms"] or row[f"{name}_error"]
