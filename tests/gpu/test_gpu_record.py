"""Kernel calls recorded as kernel nodes of XLA's command buffers (the default;
JAX_CLUSTER_RECORD=0 captures them instead), each family in a process of its
own since the mode is read once: a jit of chained calls against a float32
reference, executed on three sets of inputs in turn so XLA moves the buffers and
updates the recorded nodes' parameters rather than re-creating them. The
buffers come back to addresses seen before, where the record stage hands over
the launches it kept for them. Its counters show which calls were recorded,
which captured and which reused kept launches."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu

COMMON = """
import json
import jax, jax.numpy as jnp
import jax_cluster
from jax_cluster import _ffi

def rel(got, want):
    got, want = jnp.asarray(got, jnp.float32), jnp.asarray(want, jnp.float32)
    return float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want))

def inputs(seed, *shapes):
    keys = jax.random.split(jax.random.key(seed), len(shapes))
    return [(jax.random.normal(k, s) / s[-2] ** 0.5).astype(jnp.bfloat16) for k, s in zip(keys, shapes)]

def prepare(*args):  # what a case does to its inputs outside the jit
    return args

def report(variant, worst):
    counts = {**_ffi.record_counts(), **_ffi.kept_params_counts()}
    print("RESULT " + json.dumps({"variant": variant, "worst": worst, **counts}))
"""

DENSE = """
n = SIZE
plan = jax_cluster.plan(n, n, n, dtype=jnp.bfloat16, route="kernel"PINS)
variant = plan.variant
def chain(a, b, f=lambda a, b: jax_cluster.matmul(a, b, plan=plan)):
    for _ in range(6):
        a = f(a, b)
    return a
def reference(a, b):
    rounded = lambda a, b: (a @ b).astype(jnp.bfloat16).astype(jnp.float32)
    return chain(a.astype(jnp.float32), b.astype(jnp.float32), rounded)
shapes = [(n, n), (n, n)]
"""

# Grouped rows with an empty group, a one-row group and rows past the last group.
GROUPED = """
m, k, g = 4096, 1024, 8
sizes = jnp.array([700, 0, 1200, 300, 900, 1, 500, 400], jnp.int32)
"""

# A chain of ragged_m products with square experts, after `m, k, g, sizes`.
RAGGED = """
plan = jax_cluster.plan_ragged(m, k, k, g, problem="ragged_m", dtype=jnp.bfloat16)
variant = plan.variant
def chain(x, w):
    for _ in range(6):
        x = jax_cluster.ragged_dot(x, w, sizes, plan=plan)
    return x
def reference(x, w):
    x, w = x.astype(jnp.float32), w.astype(jnp.float32)
    for _ in range(6):
        x = jax.lax.ragged_dot(x, w, sizes).astype(jnp.bfloat16).astype(jnp.float32)
    return x
shapes = [(m, k), (g, k, k)]
"""

# Each case: a jit of 6 chained calls (XLA builds command buffers from a few
# commands on), its float32 reference, and the variant the planner picks.
CASES = {
    # one static launch
    "dense_static": DENSE.replace("SIZE", "1024").replace("PINS", ""),
    # the work queue: its counter zeroed by a recorded kernel, then a 2x1 cluster launch
    "dense_work_queue": DENSE.replace("SIZE", "2048").replace("PINS", ', schedule="dynamic"'),
    # static 2x1 cluster launches after work-queue ones and the reverse: a
    # launch that overlaps the kernel before it must still read that kernel's output
    "dense_mixed": DENSE.replace("SIZE", "2048").replace("PINS", ', schedule="static"')
    + """
queue = jax_cluster.plan(n, n, n, dtype=jnp.bfloat16, route="kernel", schedule="dynamic")
variant = [plan.variant, queue.variant]
def chain(a, b, f=None):
    for i in range(6):
        a = jax_cluster.matmul(a, b, plan=plan if i % 3 else queue) if f is None else f(a, b)
    return a
""",
    # the fused epilogue's target: bias and an activation
    "epilogue_bias_gelu": """
from jax_cluster.primitives.epilogue import gemm_epilogue
n = 1024
# static: a stream-K schedule's partials are zeroed by CUTLASS itself, which is captured
plan = jax_cluster.plan(512, n, n, dtype=jnp.bfloat16, epilogue="bias_act", route="kernel", schedule="static")
variant = plan.variant
def chain(x, w, b):
    for _ in range(6):
        x = gemm_epilogue(x, w, b[0], activation="gelu", plan=plan)
    return x
def reference(x, w, b):
    x, w, b = (t.astype(jnp.float32) for t in (x, w, b))
    for _ in range(6):
        x = jax.nn.gelu(x @ w + b[0]).astype(jnp.bfloat16).astype(jnp.float32)
    return x
shapes = [(512, n), (n, n), (1, n)]
""",
    # grouped: the preparation kernel, the zeroed counter, the grouped GEMM
    "ragged_grouped": GROUPED + RAGGED,
    # the weight gradient (ragged_k) and the input gradient, through autodiff
    "ragged_grad": GROUPED
    + """
variant = "the planner's, for each gradient"
def loss(w, x, op):
    for _ in range(3):
        x = op(x, w, sizes).astype(jnp.bfloat16)
    return jnp.sum(x.astype(jnp.float32) ** 2)
def chain(x, w):
    return jax.grad(loss)(w, x, jax_cluster.ragged_dot)
def reference(x, w):
    op = lambda x, w, s: jax.lax.ragged_dot(x.astype(jnp.float32), w.astype(jnp.float32), s)
    return jax.grad(loss)(w.astype(jnp.float32), x, op)
shapes = [(m, k), (g, k, k)]
""",
    # block-scaled fp8 (the planner's grouped row), summed over six calls on
    # other experts' weights. The inputs are e4m3 values whose every block
    # peaks at 448 (scale 1), so quantizing them is exact however XLA fuses it.
    "ragged_fp8": GROUPED
    + """
variant = "the planner's"
def exact(t):
    t = jnp.clip(t.astype(jnp.float32) * 2000, -448, 448).astype(jnp.float8_e4m3fn).astype(jnp.float32)
    return t.at[..., ::128].set(448.0)
experts = lambda w, j: jnp.roll(w, j, axis=0)
def prepare(x, w):  # the activations quantized outside: the products read the jit's parameters
    return jax_cluster.quantize(exact(x)), w
def chain(qx, w):
    w, total = exact(w), 0.0
    for j in range(6):
        qw = jax_cluster.quantize(experts(w, j), block=(128, 128))
        total = total + jax_cluster.ragged_dot(qx, qw, sizes).astype(jnp.float32)
    return total
def reference(x, w):
    x, w = exact(x), exact(w)
    total = 0.0
    for j in range(6):
        total = total + jax.lax.ragged_dot(x, experts(w, j), sizes).astype(jnp.bfloat16).astype(jnp.float32)
    return total
shapes = [(m, k), (g, k, k)]
""",
    # decode: a few rows a group, on the CUDA-core decode kernel
    "ragged_decode": """
m, k, g = 8, 2048, 8
sizes = jnp.array([2, 0, 1, 1, 3, 0, 1, 0], jnp.int32)
"""
    + RAGGED,
}

# Calls of targets without a record stage, which XLA captures into its graphs.
CAPTURED_CASES = {
    # block-scaled fp8 dense products, each weight quantized just before the
    # product that reads its scales (exactly, as in ragged_fp8)
    "dense_fp8": """
variant = "the planner's"
n = 1024
def exact(t):
    t = jnp.clip(t.astype(jnp.float32) * 2000, -448, 448).astype(jnp.float8_e4m3fn).astype(jnp.float32)
    return t.at[..., ::128].set(448.0)
def chain(x, w):
    x, w = exact(x), exact(w)
    qx, total = jax_cluster.quantize(x), 0.0
    for j in range(6):
        qw = jax_cluster.quantize(jnp.roll(w, 128 * j, axis=1), block=(128, 128))
        total = total + jax_cluster.matmul(qx, qw).astype(jnp.float32)
    return total
def reference(x, w):
    x, w = exact(x), exact(w)
    total = 0.0
    for j in range(6):
        total = total + (x @ jnp.roll(w, 128 * j, axis=1)).astype(jnp.bfloat16).astype(jnp.float32)
    return total
shapes = [(n, n), (n, n)]
""",
}

RUN = """
run = jax.jit(chain)
worst = 0.0
# Three sets of inputs taken in turn: every call's parameters differ from the
# last call's (XLA updates the recorded nodes) and come back three calls later
# (the record stage hands over the launches it kept for them)
sets = [(raw, prepare(*raw)) for raw in (inputs(seed, *shapes) for seed in range(3))]
for call in range(9):
    raw, args = sets[call % 3]
    worst = max(worst, rel(run(*args), reference(*raw)))
report(variant, worst)
"""


def run_case(name: str, record: str, **extra_env) -> dict:
    env = dict(os.environ, JAX_CLUSTER_RECORD=record, XLA_PYTHON_CLIENT_PREALLOCATE="false", **extra_env)
    case = CASES[name] if name in CASES else CAPTURED_CASES[name]
    program = textwrap.dedent(COMMON) + textwrap.dedent(case) + textwrap.dedent(RUN)
    run = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-8000:]
    line = next(x for x in run.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    print(name, "recorded" if record == "1" else "captured", result)
    return result


@pytest.mark.parametrize("name", sorted(CASES))
def test_recorded_calls_match_the_reference_as_their_buffers_move(name):
    got = run_case(name, "1")
    assert got["worst"] < 2e-2, got
    # every call of the family was recorded: nodes created once, then updated,
    # some with the launches kept from an earlier call whose buffers they reuse
    assert got["created"] > 0 and got["updated"] > 0 and got["captured"] == 0, got
    assert got["reused"] > 0, got


def test_captured_calls_still_match_when_recording_is_off():
    got = run_case("ragged_grouped", "0")
    assert got["worst"] < 2e-2, got
    assert got["created"] == got["updated"] == got["captured"] == 0, got


# Where kernels are launched as programmatic dependents of the kernel before
# them (kernels/launch_recording.h): by default (on XLA's graph nodes and on
# the stream, which XLA's capture turns into a programmatic edge), with XLA's
# command buffers off or the kernel calls kept out of them, and on the stream
# only. The block-scaled kernel must not be one: its scale-loading warp does
# not wait.
LAUNCH_MODES = {
    "default": {},
    "stream_no_command_buffers": {"XLA_FLAGS": os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer="},
    "stream_own_thunks": {"JAX_CLUSTER_COMMAND_BUFFERS": "0"},
    "stream_only": {"JAX_CLUSTER_PDL": "stream"},
}


@pytest.mark.parametrize("mode", sorted(LAUNCH_MODES))
@pytest.mark.parametrize("name", ["dense_static", "dense_mixed", "dense_fp8"])
def test_overlapped_launches_read_the_kernel_before_them(name, mode):
    got = run_case(name, "1", **LAUNCH_MODES[mode])
    assert got["worst"] < 2e-2, got


# A dense kernel without a workspace keeps its launch parameters per problem
# and moves them to each call's buffers (kernels/kept_params.h); one with a
# workspace (the work queue's counter) describes every launch afresh.
@pytest.mark.parametrize("mode", sorted(LAUNCH_MODES))
def test_dense_launches_move_kept_parameters_to_their_buffers(mode):
    got = run_case("dense_static", "1", **LAUNCH_MODES[mode])
    assert got["worst"] < 2e-2, got
    assert got["kept"] > 0 and got["repointed"] > 0, got
    queue = run_case("dense_work_queue", "1", **LAUNCH_MODES[mode])
    assert queue["worst"] < 2e-2, queue
    assert queue["kept"] == queue["repointed"] == 0, queue
