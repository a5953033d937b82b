"""What a newcomer sees first: the import from an unbuilt source checkout
says so and how to run instead, and info() reads cleanly on a CPU host."""

import pathlib
import subprocess
import sys

import jax
import pytest

import jax_cluster

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.skipif(any((ROOT / "jax_cluster").glob("_ext*.so")), reason="this source tree holds a built extension")
def test_import_from_an_unbuilt_checkout_says_what_is_missing():
    run = subprocess.run(
        [sys.executable, "-c", "import jax_cluster; print(jax_cluster.info())"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"},
    )
    assert run.returncode == 0, run.stderr
    said = run.stdout + run.stderr
    assert "source checkout that was never built" in said and "outside the checkout" in said
    assert "circular import" not in said


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="describes a CPU host")
def test_info_on_a_cpu_host_reads_cleanly():
    text = str(jax_cluster.info())
    assert "device: CPU -> XLA fallback" in text
    assert "None" not in text and "cpu cpu" not in text
