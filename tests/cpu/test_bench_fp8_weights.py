"""The weight-quantization benchmark's harness on the CPU: a smoke run
records each contender's time (the kernel's absence with its reason) and
the floor, and the two portable forms agree."""

import importlib
import json
import pathlib
import sys

import jax
import numpy as np
import pytest

pytest.importorskip("qwix")
BENCHMARKS = pathlib.Path(__file__).parents[2] / "benchmarks"


def _bench():
    sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module("bench_fp8_weights")


def test_smoke_run_records_every_contender(tmp_path):
    bench = _bench()
    bench.main(["--smoke", "--iterations", "1", "--out", str(tmp_path)])
    record = json.loads((tmp_path / "fp8_weights.json").read_text())
    (row,) = record["rows"]
    assert (row["groups"], row["k"], row["n"], row["dtype"]) == (2, 256, 384, "bfloat16")
    assert row["xla_ms"] > 0 and row["qwix_ms"] > 0 and row["floor_ms"] > 0
    assert row.get("jc_ms", 0) > 0 or "no kernel" in row["jc_error"]


def test_the_xla_form_and_the_qwix_path_give_the_same_layouts_for_f32():
    bench = _bench()
    w = jax.random.normal(jax.random.key(0), (2, 256, 384))
    # under jit, as the benchmark times them: eager dispatch may divide by the
    # format's largest value exactly where jit multiplies by its reciprocal
    assert bench.bitwise_equal(jax.jit(bench.xla_form)(w), jax.jit(bench.through_qwix)(w))
    kn, nk, _ = bench.xla_form(w)
    np.testing.assert_array_equal(np.asarray(kn).view(np.uint8), np.asarray(nk).transpose(0, 2, 1).view(np.uint8))
