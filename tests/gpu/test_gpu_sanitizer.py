"""compute-sanitizer over one small call of every kernel variant and schedule
(sanitizer_calls.py): memcheck and racecheck report nothing. Each buffer is
its own allocation (XLA_PYTHON_CLIENT_ALLOCATOR=platform), so an access past
one is seen rather than landing inside XLA's pool. JAX_CLUSTER_SANITIZE_VARIANTS,
a regex, limits the calls to the variants it matches (none matching fails)."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu
SANITIZER = shutil.which("compute-sanitizer") or next(
    (str(p) for p in pathlib.Path("/usr/local/cuda/bin").glob("compute-sanitizer")), None
)
CALLS = pathlib.Path(__file__).with_name("sanitizer_calls.py")


@pytest.mark.skipif(SANITIZER is None, reason="compute-sanitizer is not installed")
@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_every_kernel_is_clean_under_compute_sanitizer(tool):
    env = dict(os.environ, XLA_PYTHON_CLIENT_ALLOCATOR="platform", XLA_PYTHON_CLIENT_PREALLOCATE="false")
    run = subprocess.run(
        [
            SANITIZER,
            "--tool",
            tool,
            "--error-exitcode",
            "3",
            sys.executable,
            str(CALLS),
            os.environ.get("JAX_CLUSTER_SANITIZE_VARIANTS", ""),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    log = run.stdout[-4000:] + run.stderr[-4000:]
    assert run.returncode == 0, log
    assert "calls: " in run.stdout and ", failures: 0" in run.stdout, log
    print(run.stdout.strip().splitlines()[-1])  # "calls: N, failures: 0", for the log
    assert "ERROR SUMMARY: 0 errors" in run.stdout + run.stderr, log
