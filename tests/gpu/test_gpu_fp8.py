"""The block-scaled fp8 kernel on a Hopper GPU, through the planner's plans: matmul
of quantized operands and the in-place [N, K] product against the float32
product of their dequantized values (tight) and against the bf16 product of
the unquantized inputs (the quantization's own error, stated), with
NaN-poisoned outputs (conftest) and bitwise-repeatable results."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import fresh_key

import jax_cluster
from jax_cluster.ops.fp8_dense import scaled_product
from jax_cluster.planning import tables

pytestmark = pytest.mark.gpu
E4M3 = jnp.float8_e4m3fn


def _rel(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return np.linalg.norm(out - ref) / np.linalg.norm(ref)


def _kernel_plan(m, n, k):
    p = jax_cluster.plan(m, n, k, dtype=E4M3, out_dtype=jnp.bfloat16, b_major="k")
    if p.path != "kernel":
        pytest.skip(f"no block-scaled kernel here: {p.reason}")
    return p


@pytest.mark.parametrize("m,n,k", [(4, 128, 128), (132, 256, 256), (1000, 1024, 4096), (4096, 4096, 4096)])
def test_quantized_matmul_runs_the_kernel_and_matches_its_dequantized_values(m, n, k):
    plan = _kernel_plan(m, n, k)
    ka, kb = jax.random.split(fresh_key())
    x = jax.random.normal(ka, (m, k), jnp.float32)
    w = jax.random.normal(kb, (k, n), jnp.float32)
    qx, qw = jax_cluster.quantize(x), jax_cluster.quantize(w, block=(128, 128))
    run = jax.jit(lambda qx, qw: jax_cluster.matmul(qx, qw, plan=plan))
    text = run.lower(qx, qw).as_text()
    assert tables.FFI_TARGETS["scaled_gemm"] in text, "the quantized matmul did not reach the kernel"
    out = run(qx, qw)
    assert out.dtype == jnp.bfloat16 and bool(jnp.isfinite(out).all())
    ref = np.asarray(jax_cluster.dequantize(qx), np.float64) @ np.asarray(jax_cluster.dequantize(qw), np.float64)
    assert _rel(out, ref) < 5e-3  # bf16 rounding of the output
    assert np.array_equal(np.asarray(run(qx, qw)), np.asarray(out))  # repeatable bit for bit
    # against the unquantized inputs' bf16 product: the fp8 rounding itself
    bf16 = jnp.matmul(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), preferred_element_type=jnp.float32)
    assert _rel(out, bf16) < 8e-2
    assert plan.dtype == "e4m3"


def test_an_n_by_k_weight_is_read_in_place():
    plan = _kernel_plan(256, 384, 512)
    ka, kb = jax.random.split(fresh_key())
    x = jax.random.normal(ka, (256, 512), jnp.float32)
    w = jax.random.normal(kb, (384, 512), jnp.float32)  # [N, K]
    qx, qw = jax_cluster.quantize(x), jax_cluster.quantize(w, block=(128, 128))
    out = jax.jit(lambda a, b: scaled_product(a, b, 1, jnp.bfloat16, plan))(qx, qw)
    ref = np.asarray(jax_cluster.dequantize(qx), np.float64) @ np.asarray(jax_cluster.dequantize(qw), np.float64).T
    assert _rel(out, ref) < 5e-3


def test_rows_the_kernel_cannot_take_fall_back_with_the_same_values():
    x = jax.random.normal(fresh_key(), (6, 256), jnp.float32)  # M = 6: not a multiple of 4
    w = jax.random.normal(fresh_key(), (256, 128), jnp.float32)
    qx, qw = jax_cluster.quantize(x), jax_cluster.quantize(w, block=(128, 128))
    pinned = dict(dtype=E4M3, out_dtype=jnp.bfloat16, b_major="k", tile=(128, 128, 128))
    assert jax_cluster.plan(6, 128, 256, **pinned).path == "xla"
    out = jax.jit(jax_cluster.matmul)(qx, qw)
    ref = np.asarray(jax_cluster.dequantize(qx), np.float64) @ np.asarray(jax_cluster.dequantize(qw), np.float64)
    assert _rel(out, ref) < 1e-2
