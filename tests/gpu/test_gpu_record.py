"""Kernel calls recorded as kernel nodes of XLA's command buffers
(JAX_CLUSTER_RECORD=1), in a process of their own since the mode is read
once: a jit of chained kernel calls against a float32 reference, executed on
fresh inputs each time so XLA moves the buffers and updates the recorded
nodes' parameters rather than re-creating them."""

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu

PROGRAM = textwrap.dedent(
    """
    import jax, jax.numpy as jnp
    from jax_cluster import _ffi
    from jax_cluster.planning.dense import plan_gemm
    from jax_cluster.primitives.gemm import gemm

    n = 1024
    plan = plan_gemm(n, n, n, dtype=jnp.bfloat16, a_major="k", b_major="n", route="kernel")
    assert plan.uses_kernel, plan.reason

    @jax.jit
    def chain(a, b):
        for _ in range(4):
            a = gemm(a, b, a_major="k", b_major="n", plan=plan)
        return a

    def reference(a, b):
        for _ in range(4):
            a = (a.astype(jnp.float32) @ b.astype(jnp.float32)).astype(jnp.bfloat16)
        return a.astype(jnp.float32)

    worst = 0.0
    for seed in range(6):
        ka, kb = jax.random.split(jax.random.key(seed))
        a = (jax.random.normal(ka, (n, n)) / n**0.5).astype(jnp.bfloat16)
        b = (jax.random.normal(kb, (n, n)) / n**0.5).astype(jnp.bfloat16)
        got, want = chain(a, b).astype(jnp.float32), reference(a, b)
        worst = max(worst, float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want)))
    print("recorded:", " ".join(sorted(_ffi.recorded_targets())))
    print(f"variant {plan.variant}; worst relative error {worst:.2e}")
    assert worst < 2e-2, worst
    """
)


def test_recorded_kernel_calls_match_the_reference_as_their_buffers_move():
    env = dict(os.environ, JAX_CLUSTER_RECORD="1", XLA_PYTHON_CLIENT_PREALLOCATE="false")
    run = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-8000:]
    print(run.stdout)
    assert "recorded: jax_cluster_gemm" in run.stdout, run.stdout + run.stderr[-4000:]
