"""compute-sanitizer over one small call of every kernel variant and schedule
(sanitizer_calls.py): memcheck and racecheck report nothing. Each buffer is
its own allocation (XLA_PYTHON_CLIENT_ALLOCATOR=platform), so an access past
one is seen rather than landing inside XLA's pool.

Each kernel family runs in a process of its own: memcheck's process has died
at the first grouped call after dense calls, with no report of its own
(docs/performance.md), which left every later call unchecked.
JAX_CLUSTER_SANITIZE_VARIANTS, a regex, limits the calls to the variants it
matches; a family with no match is skipped, saying so. The tool's output
streams to JAX_CLUSTER_SANITIZE_LOGS/sanitizer_<tool>_<family>.log (a
temporary folder by default), so a run cut off by a time limit still shows
how far it got."""

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

pytestmark = pytest.mark.gpu
SANITIZER = shutil.which("compute-sanitizer") or next(
    (str(p) for p in pathlib.Path("/usr/local/cuda/bin").glob("compute-sanitizer")), None
)
CALLS = pathlib.Path(__file__).with_name("sanitizer_calls.py")
FAMILIES = {  # regexes on variant names
    "dense": r"^sm\d+_gemm_(?!.*(blockwise|_mxe4m3_))",
    "block_scaled": r"^(?!sm\d+_ragged_decode_).*(blockwise|_mxe4m3_)",  # the decode family has its own
    "grouped": r"^sm\d+_grouped_gemm_(?!.*(blockwise|_mxe4m3_))",
    "decode": r"^sm\d+_ragged_decode_",
}
NO_MATCH = 2  # sanitizer_calls.py's exit status when no compiled variant matches
CLEAN = {  # each tool's closing line when it found nothing
    "memcheck": "ERROR SUMMARY: 0 errors",
    "racecheck": "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)",
}


@pytest.mark.skipif(SANITIZER is None, reason="compute-sanitizer is not installed")
@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_every_kernel_is_clean_under_compute_sanitizer(tool, family):
    run, output = _sanitize(tool, family, [FAMILIES[family], os.environ.get("JAX_CLUSTER_SANITIZE_VARIANTS", "")])
    if run.returncode == NO_MATCH and "no compiled variant" in output:
        pytest.skip(f"no compiled {family} variant matches JAX_CLUSTER_SANITIZE_VARIANTS here")
    _assert_clean(tool, run, output)


@pytest.mark.skipif(SANITIZER is None, reason="compute-sanitizer is not installed")
@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_the_token_tile_kernel_is_clean_under_compute_sanitizer(tool):
    _assert_clean(tool, *_sanitize(tool, "token_tiles", ["--token-tiles"]))


@pytest.mark.skipif(SANITIZER is None, reason="compute-sanitizer is not installed")
@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_the_weight_block_kernel_is_clean_under_compute_sanitizer(tool):
    _assert_clean(tool, *_sanitize(tool, "weight_blocks", ["--weight-blocks"]))


def _sanitize(tool, name, args):
    """(the finished run, its output) of sanitizer_calls.py `args` under `tool`."""
    env = dict(os.environ, XLA_PYTHON_CLIENT_ALLOCATOR="platform", XLA_PYTHON_CLIENT_PREALLOCATE="false")
    # XLA's autotuning of the reference jits under memcheck has died with a
    # segmentation fault and no report; the checked kernels are ours, not its
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_gpu_autotune_level=0".strip()
    env["PYTHONFAULTHANDLER"] = "1"  # a crash under the tool leaves the Python stack in the log
    logs = pathlib.Path(os.environ.get("JAX_CLUSTER_SANITIZE_LOGS") or tempfile.mkdtemp())
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"sanitizer_{tool}_{name}.log"
    command = [SANITIZER, "--tool", tool, "--error-exitcode", "3", sys.executable, str(CALLS)]
    with log_path.open("w") as log_file:
        run = subprocess.run(
            [*command, *args], stdout=log_file, stderr=subprocess.STDOUT, text=True, env=env, timeout=1800
        )
    return run, log_path.read_text()


def _assert_clean(tool, run, output):
    tail = output[-8000:]
    assert run.returncode == 0, tail
    summary = [line for line in output.splitlines() if line.startswith("calls: ")]
    assert summary and summary[-1].endswith(", failures: 0"), tail
    print(summary[-1])  # "calls: N, failures: 0", for the log
    assert CLEAN[tool] in output, tail
