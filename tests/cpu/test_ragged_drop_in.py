"""ragged_dot as a drop-in for lax.ragged_dot: lax's positional arguments,
group sizes of any integer dtype, integer operands, and group_offset (the
expert-parallel form: rhs holds only the local groups) with its gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import group_bounds, rel_error
from jax import lax

import jax_cluster


def operands(m=96, k=16, n=24, groups=6, local=None, seed=0, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    lhs = jnp.asarray(rng.standard_normal((m, k)), dtype)
    rhs = jnp.asarray(rng.standard_normal((local or groups, k, n)), dtype)
    return lhs, rhs


def offset_reference(lhs, rhs, sizes, offset):
    """float64: rows of group g in [offset, offset + G_local) times rhs[g - offset], the rest zero."""
    lhs, rhs = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    out = np.zeros((lhs.shape[0], rhs.shape[2]))
    for g, (lo, hi) in enumerate(group_bounds(sizes, lhs.shape[0])):
        if offset <= g < offset + rhs.shape[0]:
            out[lo:hi] = lhs[lo:hi] @ rhs[g - offset]
    return out


@pytest.mark.parametrize("dtype", [jnp.uint32, jnp.int16, jnp.uint8, jnp.int8, jnp.int32])
def test_group_sizes_of_any_integer_dtype(dtype):
    lhs, rhs = operands()
    sizes = np.array([10, 0, 30, 5, 20, 25])
    got = jax_cluster.ragged_dot(lhs, rhs, jnp.asarray(sizes, dtype))
    want = lax.ragged_dot(lhs, rhs, jnp.asarray(sizes, jnp.int32), precision="highest")
    assert rel_error(got, want) < 1e-5


@pytest.mark.parametrize("dtype", [jnp.int8, jnp.uint8, jnp.int16])
def test_narrow_size_dtypes_with_more_rows_than_they_hold(dtype):
    lhs, rhs = operands(m=300, groups=3)
    sizes = [100, 27, 120]  # 300 rows: past int8's and uint8's range, each size within it
    got = jax_cluster.ragged_dot(lhs, rhs, jnp.asarray(sizes, dtype))
    assert rel_error(got, offset_reference(lhs, rhs, sizes, 0)) < 1e-5


def test_unsigned_sizes_past_the_rows_are_cut_not_wrapped():
    lhs, rhs = operands(groups=2)
    sizes = jnp.asarray([40, 2**32 - 1], jnp.uint32)  # would wrap to -1 as int32
    got = jax_cluster.ragged_dot(lhs, rhs, sizes)
    assert rel_error(got, offset_reference(lhs, rhs, [40, 96], 0)) < 1e-5


def test_lax_positional_order_and_float_group_sizes_refused():
    lhs, rhs = operands()
    sizes = jnp.asarray([16] * 6, jnp.int32)
    got = jax_cluster.ragged_dot(lhs, rhs, sizes, lax.Precision.HIGHEST, jnp.float32)
    assert got.dtype == jnp.float32
    assert rel_error(got, lax.ragged_dot(lhs, rhs, sizes, precision="highest")) < 1e-5
    with pytest.raises(TypeError, match="integer dtype"):
        jax_cluster.ragged_dot(lhs, rhs, sizes.astype(jnp.float32))


def test_integer_operands_run_on_lax():
    rng = np.random.default_rng(3)
    lhs = jnp.asarray(rng.integers(-3, 4, (32, 8)), jnp.int8)
    rhs = jnp.asarray(rng.integers(-3, 4, (4, 8, 5)), jnp.int8)
    sizes = jnp.asarray([8, 0, 20, 10], jnp.int32)  # sum > M: cut at the rows
    got = jax_cluster.ragged_dot(lhs, rhs, sizes, preferred_element_type=jnp.int32)
    want = offset_reference(lhs, rhs, [8, 0, 20, 10], 0)
    assert got.dtype == jnp.int32 and np.array_equal(np.asarray(got), want)


SIZES = [12, 0, 30, 7, 19, 20]  # empty group, rows left over (M = 96)


@pytest.mark.parametrize("offset", [0, 1, 2, 3, 4, 5, 6, -1])
def test_group_offset_matches_the_reference(offset):
    lhs, rhs = operands(local=2, seed=offset + 10)
    got = jax.jit(jax_cluster.ragged_dot)(lhs, rhs, jnp.asarray(SIZES, jnp.int32), None, None, offset)
    assert rel_error(got, offset_reference(lhs, rhs, SIZES, offset)) < 1e-5


def test_group_offset_as_lax_documents_it():
    """lax.ragged_dot documents group_offset as a (1,) array; a scalar is
    taken too, and a float one is refused rather than truncated."""
    lhs, rhs = operands(local=2)
    sizes = jnp.asarray(SIZES, jnp.int32)
    want = offset_reference(lhs, rhs, SIZES, 3)
    for offset in (jnp.array([3], jnp.int32), jnp.int32(3), 3):
        assert rel_error(jax_cluster.ragged_dot(lhs, rhs, sizes, group_offset=offset), want) < 1e-5
    with pytest.raises(TypeError, match="group_offset must be an integer"):
        jax_cluster.ragged_dot(lhs, rhs, sizes, group_offset=1.5)
    with pytest.raises(ValueError, match=r"scalar or of shape \(1,\)"):
        jax_cluster.ragged_dot(lhs, rhs, sizes, group_offset=jnp.array([1, 2]))


def test_group_offset_is_traced_not_baked_in():
    lhs, rhs = operands(local=3)
    f = jax.jit(lambda x, w, s, o: jax_cluster.ragged_dot(x, w, s, group_offset=o))
    for offset in (0, 2, 3):
        got = f(lhs, rhs, jnp.asarray(SIZES, jnp.int32), jnp.int32(offset))
        assert rel_error(got, offset_reference(lhs, rhs, SIZES, offset)) < 1e-5


@pytest.mark.parametrize("rhs_layout", ["gkn", "gnk"])
def test_group_offset_gradients(rhs_layout):
    lhs, rhs = operands(local=2, seed=5)
    offset, sizes = 2, jnp.asarray(SIZES, jnp.int32)
    w = rhs if rhs_layout == "gkn" else jnp.swapaxes(rhs, 1, 2)
    ct = jnp.asarray(np.random.default_rng(6).standard_normal((96, 24)), jnp.float32)

    def ours(x, w):
        return (jax_cluster.ragged_dot(x, w, sizes, group_offset=offset, rhs_layout=rhs_layout) * ct).sum()

    def reference(x, w):  # the local groups' rows through a one-hot mask, in float32
        w = w if rhs_layout == "gkn" else jnp.swapaxes(w, 1, 2)
        owner = np.full(96, -1)
        for g, (lo, hi) in enumerate(group_bounds(SIZES, 96)):
            owner[lo:hi] = g - offset
        onehot = jnp.asarray(owner[:, None] == np.arange(w.shape[0])[None, :], jnp.float32)
        out = jnp.einsum("mg,mk,gkn->mn", onehot, x, w, precision="highest")
        return (out * ct).sum()

    for got, want in zip(jax.grad(ours, (0, 1))(lhs, w), jax.grad(reference, (0, 1))(lhs, w)):
        assert rel_error(got, want) < 1e-5


def test_group_offset_with_row_blocks():
    lhs, rhs = operands(m=64, local=2, seed=8)
    sizes = jnp.asarray([[10, 6, 9, 7], [0, 20, 4, 8]], jnp.int32)  # two blocks of 32 rows
    got = jax_cluster.ragged_dot(lhs, rhs, sizes, group_offset=1)
    want = np.concatenate(
        [offset_reference(lhs[:32], rhs, [10, 6, 9, 7], 1), offset_reference(lhs[32:], rhs, [0, 20, 4, 8], 1)]
    )
    assert rel_error(got, want) < 1e-5


def test_group_offset_refuses_more_local_groups_than_groups():
    lhs, rhs = operands(groups=4, local=5)
    with pytest.raises(ValueError, match="5 groups but group_sizes only 4"):
        jax_cluster.ragged_dot(lhs, rhs, jnp.asarray([24] * 4, jnp.int32), group_offset=0)


@pytest.mark.parametrize("activation", ["silu", "gelu", jnp.tanh])
def test_activation_by_name_or_callable(activation):
    lhs, rhs = operands(seed=9)
    sizes = jnp.asarray([16] * 6, jnp.int32)
    fn = (
        jax.nn.silu
        if activation == "silu"
        else (lambda x: jax.nn.gelu(x, approximate=True))
        if activation == "gelu"
        else activation
    )
    got = jax_cluster.ragged_dot(lhs, rhs, sizes, activation=activation)
    assert rel_error(got, fn(lax.ragged_dot(lhs, rhs, sizes, precision="highest"))) < 1e-5
