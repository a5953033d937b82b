"""python -m jax_cluster.selftest: nothing to test without a GPU (exit 2), and
every case it would run is planned on its variant (tests/gpu/test_gpu_tools.py
runs it on a GPU)."""

import os
import pathlib
import subprocess
import sys

import pytest
from conftest import GPU

import jax_cluster
from jax_cluster.planning import tables
from jax_cluster.planning.device import DeviceInfo
from jax_cluster.tools import selftest


@pytest.mark.skipif(GPU is not None, reason="a GPU is present")
def test_without_a_gpu_there_is_nothing_to_test(tmp_path):
    # run the package this test imported, from outside the source tree
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(jax_cluster.__file__).parents[1]))
    out = subprocess.run(
        [sys.executable, "-m", "jax_cluster.selftest"], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert out.returncode == 2 and "nothing to test" in out.stdout, out.stdout + out.stderr


H200 = DeviceInfo("cuda", "described H200", (9, 0), 132, 232448, 50 << 20)
B200 = DeviceInfo("cuda", "described B200", (10, 0), 148, 232448, 126 << 20)


@pytest.mark.parametrize("variant", [v for v in tables.load_menu()], ids=lambda v: v.name)
def test_every_selftest_case_is_planned_on_its_variant(variant):
    """The self-test pins each case to one variant; a case the planner refuses
    (say an odd leading dimension TMA cannot take) would fail on the GPU."""
    device = H200 if variant.arch == "sm90a" else B200
    clusters = 3  # small enough that the boundary shapes stay cheap to plan
    if variant.problem == "dense":
        for schedule in variant.schedules:
            for _, m, n, k in selftest.dense_cases(variant, clusters, quick=False):
                plan = selftest.dense_plan(variant, schedule, m, n, k, device=device)
                assert (plan.m, plan.n, plan.k, plan.schedule) == (m, n, k, schedule)
    else:
        for _, sizes, rows, kdim, ndim in selftest.grouped_cases(variant, clusters, quick=False):
            selftest.grouped_plan(variant, len(sizes), rows, kdim, ndim, device=device)


def test_odd_shapes_stay_odd_and_aligned_for_transposed_a():
    mn = next(v for v in tables.load_menu() if v.a_major == "m" and v.arch == "sm90a")
    for m, n, k in selftest.ODD_SHAPES:
        om, on, ok = selftest.odd_shape(mn, m, n, k)
        # A's leading M aligned; K ragged against the K tile instead
        assert om % 8 == 0 and on % 8 == 0 and ok % mn.tile_k != 0
