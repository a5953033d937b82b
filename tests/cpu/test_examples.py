"""The examples run, briefly, and agree with their references (CPU: the fallback)."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def run_example(name, *args):
    pytest.importorskip("flax")
    pytest.importorskip("optax")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args], env=env, capture_output=True, text=True, timeout=600
    )


def test_train_block_curves_agree_and_are_recorded(tmp_path):
    run = run_example("train_block.py", "--steps", "4", "--rounds", "2", "--calls", "2", "--out", str(tmp_path))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "max |loss difference|" in run.stdout and "step time" in run.stdout
    record = json.loads((tmp_path / "train_block_bfloat16.json").read_text())
    assert len(record["loss"]["jax_cluster"]) == len(record["loss"]["flax"]) == 4
    assert set(record["step_ms"]) == {"jax_cluster", "flax"}
    # the step and each block timed on both sides
    assert set(record["timed_ms"]) == {"step", "attention", "dense_mlp", "moe_mlp"}
    assert all(set(t) == {"jax_cluster", "flax"} and min(t.values()) > 0 for t in record["timed_ms"].values())
    # the host's dispatch of the same probes, within their back-to-back spans
    assert set(record["enqueue_ms"]) == set(record["timed_ms"])
    assert all(min(t.values()) > 0 for t in record["enqueue_ms"].values())
    assert record["device_ms"] is None  # CUPTI times kernels on a GPU only
    assert record["max_difference_of_first_loss"] <= record["tolerance"]


def test_train_block_trains_in_mxfp8_at_the_compact_size(tmp_path):
    pytest.importorskip("qwix")
    args = ("--size", "compact", "--fp8", "mxfp8", "--steps", "4", "--rounds", "1", "--calls", "2")
    run = run_example("train_block.py", *args, "--out", str(tmp_path))
    assert run.returncode == 0, run.stdout + run.stderr
    record = json.loads((tmp_path / "train_block_bfloat16_compact_mxfp8.json").read_text())
    assert record["fp8"] == "mxfp8" and record["dims"]["features"] == 128
    assert "difference_of_the_last_20_steps" in record


def test_train_block_trains_data_parallel_in_fp8_at_the_compact_size(tmp_path):
    """The blockwise recipe (the default) on 8 host devices, the batch split
    across them: the fp8 products and quantizations run per device, and the
    curve follows Flax's."""
    pytest.importorskip("qwix")
    args = ("--data-parallel", "--size", "compact", "--fp8", "--steps", "3", "--rounds", "1", "--calls", "1")
    run = run_example("train_block.py", *args, "--out", str(tmp_path))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "data parallel over 8 devices" in run.stdout
    record = json.loads((tmp_path / "train_block_bfloat16_compact_fp8_dp8.json").read_text())
    assert record["data_parallel_devices"] == 8 and record["max_difference_of_first_loss"] <= record["tolerance"]
    assert record["fp8"] == "blockwise" and record["dims"]["features"] == 128
    assert "difference_of_the_last_20_steps" in record


def test_train_block_measures_curves_against_the_first_loss():
    pytest.importorskip("flax")
    pytest.importorskip("optax")
    spec = importlib.util.spec_from_file_location("train_block", EXAMPLES / "train_block.py")
    train_block = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_block)
    assert train_block.curve_difference([4.0, 2.0, 1.0], [4.0, 2.2, 1.0]) == pytest.approx(0.05)
    with pytest.raises(ValueError, match="cannot be compared"):
        train_block.curve_difference([1.0], [1.0, 2.0])


@pytest.mark.parametrize("dispatch", ["all_to_all", "gather"])
def test_expert_parallel_matches_dense_reference(dispatch):
    run = run_example("expert_parallel.py", "--dispatch", dispatch)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"{dispatch}: 8 devices" in run.stdout
