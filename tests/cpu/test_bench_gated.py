"""The gated-epilogue benchmark's harness on the CPU: a smoke run records,
for every case, each contender's time and its error against float32 (the
layers against each other), and the plot reads the record."""

import importlib
import json
import pathlib
import sys

import pytest

pytest.importorskip("flax")
BENCHMARKS = pathlib.Path(__file__).parents[2] / "benchmarks"


def test_smoke_run_records_every_contender(tmp_path):
    sys.path.insert(0, str(BENCHMARKS))
    bench = importlib.import_module("bench_gated")
    bench.main(["--smoke", "--configs", "smoke-a", "--routings", "skewed", "--iterations", "1", "--out", str(tmp_path)])
    record = json.loads((tmp_path / "gated.json").read_text())
    (row,) = record["rows"]
    assert (row["config"], row["routing"], row["rows"]) == ("smoke-a", "skewed", 128)
    for name in ("gated", "product_then_gate", "separate", "layer", "layer_gated", "layer_product_then_gate"):
        assert row[f"{name}_ms"] > 0, name
    for name in ("gated", "product_then_gate", "separate"):
        assert row[f"{name}_rel_err_vs_f32"] < bench.MAX_REL_ERR
    assert row["layer_gated_rel_err_vs_layer"] < bench.MAX_REL_ERR
    assert (tmp_path / "gated.png").exists() or "matplotlib" not in sys.modules
