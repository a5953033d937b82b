"""matmul and dot_general accept what jnp.matmul and lax.dot_general accept and
return what they return: every dtype jnp computes (integers, bool, complex,
float64 under x64, mixed dtypes promoted the same way) and zero-size dimensions."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jax_cluster

DTYPES = [jnp.int8, jnp.uint8, jnp.int16, jnp.int32, jnp.bool_, jnp.float16, jnp.bfloat16, jnp.float32, jnp.complex64]


def draw(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return jnp.asarray(rng.standard_normal(shape) + 1j * rng.standard_normal(shape), dtype)
    if dtype == jnp.bool_:
        return jnp.asarray(rng.integers(0, 2, shape).astype(bool))
    if jnp.issubdtype(dtype, jnp.integer):
        return jnp.asarray(rng.integers(0, 5, shape), dtype)
    return jnp.asarray(rng.standard_normal(shape), dtype)


def assert_same(ours, theirs):
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, (ours.shape, ours.dtype, theirs.dtype)
    exact = not jnp.issubdtype(theirs.dtype, jnp.inexact)
    rtol = 0 if exact else {jnp.bfloat16: 2e-2, jnp.float16: 2e-3}.get(theirs.dtype.type, 1e-5)
    np.testing.assert_allclose(
        np.asarray(ours, np.complex128), np.asarray(theirs, np.complex128), rtol=rtol, atol=rtol * 10
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_matmul_matches_jnp_for_every_dtype(dtype):
    a, b = draw((5, 7), dtype, 0), draw((7, 3), dtype, 1)
    assert_same(jax.jit(jax_cluster.matmul)(a, b), jnp.matmul(a, b))


@pytest.mark.parametrize(
    "da,db",
    [(jnp.int32, jnp.float32), (jnp.bfloat16, jnp.float32), (jnp.float16, jnp.bfloat16), (jnp.int8, jnp.bfloat16)],
)
def test_mixed_dtypes_promote_as_jnp(da, db):
    a, b = draw((4, 6), da, 2), draw((6, 8), db, 3)
    assert_same(jax_cluster.matmul(a, b), jnp.matmul(a, b))


@pytest.mark.parametrize(
    "a_shape,b_shape",
    [
        ((4, 0), (0, 5)),
        ((0, 3), (3, 5)),
        ((4, 3), (3, 0)),
        ((2, 0, 3), (3, 4)),
        ((2, 4, 0), (2, 0, 5)),
        ((0,), (0,)),
        ((3,), (3, 0)),
    ],
)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32, jnp.int32], ids=lambda d: jnp.dtype(d).name)
def test_zero_size_dimensions_return_what_jnp_returns(a_shape, b_shape, dtype):
    a, b = draw(a_shape, dtype, 4), draw(b_shape, dtype, 5)
    assert_same(jax_cluster.matmul(a, b), jnp.matmul(a, b))


def test_zero_size_gradient_is_zero():
    a, b = draw((4, 0), jnp.float32, 6), draw((0, 5), jnp.float32, 7)
    da, db = jax.grad(lambda a, b: jax_cluster.matmul(a, b).sum(), (0, 1))(a, b)
    assert da.shape == a.shape and db.shape == b.shape


def test_preferred_element_type_and_precision_pass_through():
    a, b = draw((4, 6), jnp.int8, 8), draw((6, 3), jnp.int8, 9)
    assert_same(
        jax_cluster.matmul(a, b, preferred_element_type=jnp.int32), jnp.matmul(a, b, preferred_element_type=jnp.int32)
    )
    x, y = draw((4, 6), jnp.float32, 10), draw((6, 3), jnp.float32, 11)
    assert_same(jax_cluster.matmul(x, y, precision=lax.Precision.HIGHEST), jnp.matmul(x, y, precision="highest"))
    with pytest.raises(ValueError, match="disagree"):
        jax_cluster.matmul(x, y, out_dtype=jnp.bfloat16, preferred_element_type=jnp.float32)


DOTS = [
    (((1,), (0,)), ((), ())),  # [M,K] x [K,N]
    (((1,), (1,)), ((), ())),  # [M,K] x [N,K]
    (((0,), (0,)), ((), ())),  # [K,M] x [K,N]
]


@pytest.mark.parametrize("dims", DOTS, ids=["kn", "kk", "mn"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_dot_general_matches_lax_for_every_dtype(dims, dtype):
    (lc, rc), _ = dims
    a = draw((6, 4) if lc == (0,) else (4, 6), dtype, 12)
    b = draw((3, 6) if rc == (1,) else (6, 3), dtype, 13)
    assert_same(jax_cluster.dot_general(a, b, dims), lax.dot_general(a, b, dims))


@pytest.mark.parametrize("a_shape,b_shape", [((4, 0), (0, 5)), ((0, 3), (3, 5)), ((4, 3), (3, 0))])
def test_dot_general_zero_size(a_shape, b_shape):
    a, b = draw(a_shape, jnp.bfloat16, 14), draw(b_shape, jnp.bfloat16, 15)
    dims = (((1,), (0,)), ((), ()))
    assert_same(jax_cluster.dot_general(a, b, dims), lax.dot_general(a, b, dims))


def test_dot_general_integer_accumulation():
    a, b = draw((4, 6), jnp.int8, 16), draw((6, 3), jnp.int8, 17)
    dims = (((1,), (0,)), ((), ()))
    got = jax_cluster.dot_general(a, b, dims, preferred_element_type=jnp.int32)
    assert_same(got, lax.dot_general(a, b, dims, preferred_element_type=jnp.int32))


def test_float64_under_x64_matches_jnp():
    code = (
        "import jax, jax.numpy as jnp, numpy as np, jax_cluster\n"
        "a = jnp.asarray(np.random.default_rng(0).standard_normal((5, 7)))\n"
        "b = jnp.asarray(np.random.default_rng(1).standard_normal((7, 3)))\n"
        "assert a.dtype == jnp.float64\n"
        "ours, theirs = jax_cluster.matmul(a, b), jnp.matmul(a, b)\n"
        "assert ours.dtype == jnp.float64, ours.dtype\n"
        "np.testing.assert_allclose(ours, theirs, rtol=1e-12)\n"
        "d = jax_cluster.dot_general(a, b, (((1,), (0,)), ((), ())))\n"
        "assert d.dtype == jnp.float64 and np.allclose(d, theirs, rtol=1e-12)\n"
        "print('ok')\n"
    )
    env = dict(os.environ, JAX_ENABLE_X64="1", JAX_PLATFORMS="cpu")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd="/")
    assert run.returncode == 0 and "ok" in run.stdout, run.stdout + run.stderr
