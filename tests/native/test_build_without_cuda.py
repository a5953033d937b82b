"""Without any CUDA compiler the package still builds, imports, warns, says
so in info(), and every call falls back to XLA's dot."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _tool(name):
    beside = pathlib.Path(sys.executable).parent / name
    return str(beside) if beside.exists() else shutil.which(name)


@pytest.mark.skipif(_tool("cmake") is None or _tool("ninja") is None, reason="needs cmake and ninja")
def test_build_without_cuda_falls_back(tmp_path):
    build = tmp_path / "build"
    subprocess.run(
        [
            _tool("cmake"),
            "-G",
            "Ninja",
            f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}",
            "-S",
            str(ROOT),
            "-B",
            str(build),
            f"-DPython_EXECUTABLE={sys.executable}",
            "-DJAX_CLUSTER_CUDA=OFF",
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run([_tool("cmake"), "--build", str(build)], check=True, capture_output=True)
    pkg = tmp_path / "pkg" / "jax_cluster"
    shutil.copytree(ROOT / "jax_cluster", pkg, ignore=shutil.ignore_patterns("_ext*", "__pycache__"))
    for so in build.glob("_ext*"):
        shutil.copy(so, pkg)
    script = (
        "import jax.numpy as jnp, numpy as np, jax_cluster\n"
        "print(jax_cluster.info())\n"
        "c = jax_cluster.matmul(jnp.arange(12.).reshape(3, 4), jnp.ones((4, 2)))\n"
        "np.testing.assert_allclose(c, np.arange(12.).reshape(3, 4) @ np.ones((4, 2)))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-W", "always", "-c", script], cwd=tmp_path / "pkg", capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    assert "built without a CUDA compiler" in out.stderr  # the warning
    assert "kernels: no: the package was built without a CUDA compiler" in out.stdout
