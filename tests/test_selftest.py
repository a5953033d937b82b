"""python -m jax_cluster.selftest: nothing to test without a GPU (exit 2);
on a GPU every compiled variant of its architecture passes (exit 0)."""
import os
import pathlib
import subprocess
import sys

import pytest

import jax_cluster
from conftest import GPU
from jax_cluster import selftest


@pytest.mark.skipif(GPU is not None, reason="a GPU is present")
def test_without_a_gpu_there_is_nothing_to_test(tmp_path):
    # run the package this test imported, from outside the source tree
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(jax_cluster.__file__).parents[1]))
    out = subprocess.run([sys.executable, "-m", "jax_cluster.selftest"], capture_output=True,
                         text=True, cwd=tmp_path, env=env)
    assert out.returncode == 2 and "nothing to test" in out.stdout, out.stdout + out.stderr


@pytest.mark.gpu
def test_selftest_passes_on_the_gpu(capsys):
    assert selftest.main(["--quick"]) == 0, capsys.readouterr().out
