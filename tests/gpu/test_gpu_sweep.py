"""The seeded sweep (tests/sweep.py) on the kernels: several hundred cases of
matmul, every dot_general form, ragged_dot groupings, linear activations and
block-scaled fp8 matmul and ragged_dot (row blocks included), each checked
elementwise and normwise against a float64 reference; and
problems with more than 2^31 elements in an operand or in the output, checked
on sampled rows."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sweep

import jax_cluster

pytestmark = pytest.mark.gpu
CASES = 420


@pytest.mark.parametrize("index", range(CASES))
def test_sweep_case_on_the_kernels(index):
    failure = sweep.check(sweep.case(index))
    assert not failure, failure


def _sampled_rows(m, seed):
    """A few dozen rows, the first and the last included."""
    return np.concatenate([[0], np.sort(np.random.default_rng(seed).choice(m, 48, replace=False)), [m - 1]])


def _rows_match(out, rows, ref):
    """out[rows] against `ref`, float32 products of the same rows computed apart."""
    got = np.asarray(jnp.asarray(out[rows], jnp.float32), np.float64)
    ref = np.asarray(ref, np.float64)
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert np.isfinite(got).all() and rel < 1e-2, rel


def _f32_dot(x, y):
    return jnp.dot(x.astype(jnp.float32), y.astype(jnp.float32), precision="highest")


@pytest.mark.parametrize("m,n,k", [(131072, 256, 16384), (65536, 32768, 64)], ids=["operand", "output"])
def test_more_than_2_31_elements(m, n, k):
    """A [131072,16384] and D [65536,32768] each hold 2^31 elements (4 GiB in bf16)."""
    key = jax.random.key(m + n)
    ka, kb = jax.random.split(key)
    a = jax.random.normal(ka, (m, k), jnp.bfloat16)
    b = jax.random.normal(kb, (k, n), jnp.bfloat16)
    assert jax_cluster.plan(m, n, k, dtype=jnp.bfloat16).uses_kernel
    out = jax.jit(jax_cluster.matmul)(a, b)
    rows = _sampled_rows(m, m)
    _rows_match(out, rows, _f32_dot(a[rows], b))


def test_grouped_operand_of_more_than_2_31_elements():
    m, k, n, groups = 131072, 16384, 256, 8
    ka, kb = jax.random.split(jax.random.key(7))
    x = jax.random.normal(ka, (m, k), jnp.bfloat16)
    w = jax.random.normal(kb, (groups, k, n), jnp.bfloat16)
    sizes = jnp.asarray([m // groups] * groups, jnp.int32)
    out = jax.jit(jax_cluster.ragged_dot)(x, w, sizes)
    rows = _sampled_rows(m, 1)
    per_group = m // groups
    ref = jnp.stack([_f32_dot(x[r], w[r // per_group]) for r in rows])
    _rows_match(out, rows, ref)
