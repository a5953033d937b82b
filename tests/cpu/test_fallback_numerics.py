"""The XLA fallback (what runs on CPU) against a float64 reference, plus
autodiff, vmap and jit through gemm_p."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import randn, reference, rel_error, tolerance
from jax import lax
from jax.test_util import check_grads

import jax_cluster
from jax_cluster.primitives.gemm import gemm

SHAPES = [
    (1, 1, 1),
    (1, 7, 3),
    (7, 1, 5),
    (3, 5, 1),
    (17, 33, 65),
    (64, 64, 64),
    (129, 127, 63),
    (200, 96, 1000),
    (256, 8, 512),
]
DTYPES = [
    (jnp.bfloat16, jnp.bfloat16),
    (jnp.bfloat16, jnp.float32),
    (jnp.float16, jnp.float16),
    (jnp.float16, jnp.float32),
    (jnp.float32, jnp.float32),
]
LAYOUTS = [("k", "n"), ("k", "k"), ("m", "n"), ("m", "k")]


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("dtype,out_dtype", DTYPES)
@pytest.mark.parametrize("a_major,b_major", LAYOUTS)
def test_gemm_fallback_matches_reference(m, n, k, dtype, out_dtype, a_major, b_major):
    a = randn((m, k) if a_major == "k" else (k, m), dtype)
    b = randn((n, k) if b_major == "k" else (k, n), dtype)
    out = jax.jit(lambda a, b: gemm(a, b, a_major=a_major, b_major=b_major, out_dtype=out_dtype))(a, b)
    assert out.dtype == out_dtype and out.shape == (m, n)
    assert rel_error(out, reference(a, b, a_major, b_major)) < tolerance(out_dtype)


@pytest.mark.parametrize(
    "a_shape,b_shape", [((4, 6, 32), (32, 24)), ((3, 16, 8), (3, 8, 40)), ((2, 1, 5, 8), (3, 8, 4)), ((8,), (8, 16))]
)
def test_matmul_batched_and_broadcast(a_shape, b_shape):
    a, b = randn(a_shape, jnp.bfloat16), randn(b_shape, jnp.bfloat16)
    out = jax.jit(jax_cluster.matmul)(a, b)
    ref = np.matmul(np.asarray(a, np.float64), np.asarray(b, np.float64))
    assert rel_error(out, ref) < tolerance(jnp.bfloat16)


def test_matmul_promotes_mixed_dtypes():
    a, b = randn((8, 16), jnp.bfloat16), randn((16, 4), jnp.float32)
    out = jax_cluster.matmul(a, b)
    assert out.dtype == jnp.float32
    assert rel_error(out, reference(a, b)) < 1e-5


@pytest.mark.parametrize(
    "dims",
    [
        (((1,), (0,)), ((), ())),  # [M,K] x [K,N]
        (((1,), (1,)), ((), ())),  # [M,K] x [N,K]
        (((0,), (0,)), ((), ())),  # [K,M] x [K,N]
        (((2,), (1,)), ((0,), (0,))),  # batched
        (((2,), (2,)), ((0,), (0,))),  # batched, rhs [B,N,K]
    ],
)
def test_dot_general_covered_forms(dims):
    shapes = {
        (((1,), (0,)), ((), ())): ((24, 40), (40, 16)),
        (((1,), (1,)), ((), ())): ((24, 40), (16, 40)),
        (((0,), (0,)), ((), ())): ((40, 24), (40, 16)),
        (((2,), (1,)), ((0,), (0,))): ((3, 24, 40), (3, 40, 16)),
        (((2,), (2,)), ((0,), (0,))): ((3, 24, 40), (3, 16, 40)),
    }
    a_shape, b_shape = shapes[dims]
    a, b = randn(a_shape, jnp.bfloat16), randn(b_shape, jnp.bfloat16)
    got = jax.jit(lambda a, b: jax_cluster.dot_general(a, b, dims))(a, b)
    ref = lax.dot_general(a.astype(jnp.float32), b.astype(jnp.float32), dims, precision=lax.Precision.HIGHEST)
    assert got.shape == ref.shape and got.dtype == jnp.bfloat16
    assert rel_error(got, ref) < tolerance(jnp.bfloat16)


def test_dot_general_uncovered_form_falls_back_to_lax():
    a, b = randn((4, 5, 6), jnp.float32), randn((6, 5, 3), jnp.float32)
    dims = (((1, 2), (1, 0)), ((), ()))
    got = jax_cluster.dot_general(a, b, dims, preferred_element_type=jnp.float32)
    ref = lax.dot_general(a, b, dims, precision=lax.Precision.HIGHEST)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_dot_general_preferred_element_type():
    a, b = randn((8, 16), jnp.bfloat16), randn((16, 8), jnp.bfloat16)
    got = jax_cluster.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    assert got.dtype == jnp.float32


@pytest.mark.parametrize("a_major,b_major", LAYOUTS)
def test_check_grads_every_layout(a_major, b_major):
    a = randn((6, 5) if a_major == "k" else (5, 6), jnp.float32)
    b = randn((4, 5) if b_major == "k" else (5, 4), jnp.float32)
    f = lambda a, b: gemm(a, b, a_major=a_major, b_major=b_major)
    # eps=1e-2 keeps float32 rounding out of the finite differences (0 of 160
    # random draws failed, against 2 with the default).
    check_grads(f, (a, b), order=2, modes=("fwd", "rev"), eps=1e-2, atol=1e-2, rtol=1e-2)


def test_grad_matmul_bf16_matches_float64():
    a, b = randn((32, 48), jnp.bfloat16), randn((48, 16), jnp.bfloat16)
    ga, gb = jax.jit(jax.grad(lambda a, b: jax_cluster.matmul(a, b, out_dtype=jnp.float32).sum(), argnums=(0, 1)))(a, b)
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    ones = np.ones((32, 16))
    assert ga.dtype == jnp.bfloat16 and gb.dtype == jnp.bfloat16
    assert rel_error(ga, ones @ b64.T) < tolerance(jnp.bfloat16)
    assert rel_error(gb, a64.T @ ones) < tolerance(jnp.bfloat16)


def test_vmap_over_a_only_and_both():
    a, b = randn((5, 12, 16), jnp.float32), randn((16, 8), jnp.float32)
    out = jax.vmap(jax_cluster.matmul, in_axes=(0, None))(a, b)
    np.testing.assert_allclose(out, np.asarray(a) @ np.asarray(b), rtol=1e-5, atol=1e-5)
    bb = randn((5, 16, 8), jnp.float32)
    out = jax.vmap(jax_cluster.matmul)(a, bb)
    np.testing.assert_allclose(out, np.asarray(a) @ np.asarray(bb), rtol=1e-5, atol=1e-5)
    out = jax.vmap(jax_cluster.matmul, in_axes=(None, 0))(a[0], bb)
    np.testing.assert_allclose(out, np.asarray(a[0]) @ np.asarray(bb), rtol=1e-5, atol=1e-5)


def test_nested_vmap_over_batched_gemm():
    a, b = randn((2, 3, 4, 6), jnp.float32), randn((2, 3, 6, 5), jnp.float32)
    f = lambda a, b: gemm(a, b)
    out = jax.vmap(f)(a, b)
    np.testing.assert_allclose(out, np.asarray(a) @ np.asarray(b), rtol=1e-5, atol=1e-5)
    # vmapped axis not in front, batch of one
    a1, b1 = randn((4, 1, 6, 7), jnp.float32), randn((1, 7, 3), jnp.float32)
    out = jax.vmap(f, in_axes=(0, None))(a1, b1)
    np.testing.assert_allclose(out, np.asarray(a1) @ np.asarray(b1), rtol=1e-5, atol=1e-5)


def test_vmap_of_grad():
    a, b = randn((3, 8, 16), jnp.float32), randn((16, 4), jnp.float32)
    g = jax.vmap(jax.grad(lambda a, b: jax_cluster.matmul(a, b).sum()), in_axes=(0, None))(a, b)
    np.testing.assert_allclose(g, np.broadcast_to(np.asarray(b).sum(1), (3, 8, 16)), rtol=1e-5, atol=1e-5)
