"""Shape and dtype rules of gemm_p and the public ops, with their messages."""

import jax
import jax.numpy as jnp
import pytest

import jax_cluster
from jax_cluster.primitives.gemm import gemm


def spec(shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


@pytest.mark.parametrize(
    "a_major,b_major,a_shape,b_shape,out",
    [
        ("k", "n", (5, 3), (3, 4), (5, 4)),
        ("k", "k", (5, 3), (4, 3), (5, 4)),
        ("m", "n", (3, 5), (3, 4), (5, 4)),
        ("m", "k", (3, 5), (4, 3), (5, 4)),
        ("k", "n", (2, 5, 3), (2, 3, 4), (2, 5, 4)),
    ],
)
def test_output_shapes(a_major, b_major, a_shape, b_shape, out):
    f = lambda a, b: gemm(a, b, a_major=a_major, b_major=b_major)
    assert jax.eval_shape(f, spec(a_shape), spec(b_shape)).shape == out


def test_out_dtype_rule():
    f = lambda a, b: gemm(a, b, out_dtype=jnp.float32)
    assert jax.eval_shape(f, spec((4, 8)), spec((8, 2))).dtype == jnp.float32


def test_wrong_rank():
    with pytest.raises(ValueError, match="rank 2"):
        jax.eval_shape(lambda a, b: gemm(a, b), spec((2, 2, 4, 8)), spec((2, 2, 8, 2)))
    with pytest.raises(ValueError, match="rank 2"):
        jax.eval_shape(lambda a, b: gemm(a, b), spec((4, 8)), spec((1, 8, 2)))


def test_contracting_mismatch():
    with pytest.raises(ValueError, match="contracting dimensions differ"):
        jax.eval_shape(lambda a, b: gemm(a, b), spec((4, 8)), spec((9, 2)))
    with pytest.raises(ValueError, match="contracting dimensions differ"):
        jax.eval_shape(jax_cluster.matmul, spec((4, 8)), spec((9, 2)))


def test_batch_mismatch():
    with pytest.raises(ValueError, match="batch sizes differ"):
        jax.eval_shape(lambda a, b: gemm(a, b), spec((2, 4, 8)), spec((3, 8, 2)))


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.int8, jnp.complex64])
def test_unsupported_dtype(dtype):
    with pytest.raises(TypeError, match="unsupported dtype"):
        jax.eval_shape(lambda a, b: gemm(a, b), spec((4, 8), dtype), spec((8, 2), dtype))


def test_unsupported_out_dtype():
    with pytest.raises(TypeError, match="unsupported output dtype"):
        jax.eval_shape(lambda a, b: gemm(a, b, out_dtype=jnp.int32), spec((4, 8)), spec((8, 2)))


def test_mismatched_operand_dtypes_at_primitive():
    with pytest.raises(TypeError, match="dtypes differ"):
        jax.eval_shape(lambda a, b: gemm(a, b), spec((4, 8)), spec((8, 2), jnp.float16))


def test_bad_layout_names():
    with pytest.raises(ValueError, match="a_major"):
        jax.eval_shape(lambda a, b: gemm(a, b, a_major="x"), spec((4, 8)), spec((8, 2)))


def test_scalar_operand_raises_as_jnp_does():
    for matmul in (jnp.matmul, jax_cluster.matmul):
        with pytest.raises(ValueError, match="ndim"):
            matmul(jnp.ones(()), jnp.ones((3,)))


def test_plan_for_another_problem_is_rejected():
    p = jax_cluster.plan(64, 64, 64, dtype=jnp.bfloat16)
    with pytest.raises(ValueError, match="plan was made for"):
        jax.eval_shape(lambda a, b: jax_cluster.matmul(a, b, plan=p), spec((32, 64)), spec((64, 64)))
    with pytest.raises(ValueError, match="bf16->bf16, but this call .* f16->f16"):
        jax.eval_shape(
            lambda a, b: jax_cluster.matmul(a, b, plan=p), spec((64, 64), jnp.float16), spec((64, 64), jnp.float16)
        )


def test_matmul_shapes_like_numpy():
    cases = [
        ((3,), (3,)),
        ((3,), (3, 4)),
        ((5, 3), (3,)),
        ((2, 5, 3), (3, 4)),
        ((2, 1, 5, 3), (4, 3, 2)),
        ((5, 3), (2, 3, 4)),
    ]
    for a, b in cases:
        got = jax.eval_shape(jax_cluster.matmul, spec(a), spec(b)).shape
        assert got == jnp.matmul(jnp.ones(a), jnp.ones(b)).shape, (a, b)
