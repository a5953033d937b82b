"""The examples run, briefly, and agree with their references (CPU: the fallback)."""
import os
import pathlib
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def run_example(name, *args):
    pytest.importorskip("flax")
    pytest.importorskip("optax")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, str(EXAMPLES / name), *args], env=env,
                          capture_output=True, text=True, timeout=600)


def test_train_block_curves_agree():
    run = run_example("train_block.py", "--steps", "6")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "max |loss difference|" in run.stdout and "step time" in run.stdout


def test_train_block_fails_when_curves_disagree():
    # a tolerance no difference meets: the exit status must say so
    run = run_example("train_block.py", "--steps", "2", "--tolerance", "-1")
    assert run.returncode == 1, run.stdout + run.stderr


def test_expert_parallel_matches_dense_reference():
    run = run_example("expert_parallel.py")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "8 devices" in run.stdout
