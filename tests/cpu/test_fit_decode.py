"""The decode fit's reading of a benchmark run: each timing goes with the
decode row of the run's operands (the bf16 and the block-scaled decode
families both have clusters of 2, 4 and 8)."""

import importlib
import pathlib
import sys

BENCHMARKS = pathlib.Path(__file__).parents[2] / "benchmarks"


def _fit():
    sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module("fit_decode")


def _row(**timings):
    return {"config": "mixtral-8x7b gate", "rows": 2, "n": 14336, "k": 4096, "experts": 8, **timings}


def test_a_bf16_run_times_the_bf16_decode_rows():
    fit = _fit()
    run = {"rows": [_row(jc_decode2_ms=0.06, jc_decode8_ms=0.07, jc_fp8_decode2_ms=0.05)]}
    got = {(v.cluster_m, v.dtype, round(seconds * 1e3, 6)) for *_, v, seconds in fit.timings(run)}
    assert got == {(2, "bf16", 0.06), (8, "bf16", 0.07)}


def test_an_fp8_run_times_the_block_scaled_decode_rows():
    fit = _fit()
    run = {"operands": "e4m3, block-scaled", "rows": [_row(jc_fp8_decode4_ms=0.05, jc_decode4_ms=0.09)]}
    ((*_, v, seconds),) = fit.timings(run)
    assert (v.cluster_m, v.dtype, v.tile_k, round(seconds * 1e3, 6)) == (4, "e4m3", 128, 0.05)
