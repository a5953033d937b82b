"""The grouped product on the CPU (primitives/tiled_ragged.py): the same result
as XLA's ragged_dot on every kind of group sizes, at a fraction of its work."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sweep
from jax import lax

import jax_cluster
from jax_cluster.primitives.lowering import clamp_group_sizes
from jax_cluster.primitives.tiled_ragged import tile_rows, tiled_ragged_k, tiled_ragged_m

_HIGHEST = lax.Precision.HIGHEST
_RAGGED_K = lax.RaggedDotDimensionNumbers((((0,), (0,)), ((), ())), lhs_ragged_dimensions=[0], rhs_group_dimensions=[])


def _one_hot(rng, rows, groups):
    sizes = np.zeros(groups, np.int32)
    sizes[rng.integers(groups)] = rows
    return jnp.asarray(sizes)


@pytest.mark.parametrize("rows,k,n,groups", [(1, 16, 8, 4), (37, 24, 40, 5), (200, 32, 16, 16), (96, 8, 24, 1)])
def test_every_kind_of_sizes_gives_xla_ragged_dot_result(rows, k, n, groups):
    rng = np.random.default_rng(rows * groups)
    a = jnp.asarray(rng.standard_normal((rows, k)), jnp.float32)
    b = jnp.asarray(rng.standard_normal((groups, k, n)), jnp.float32)
    c = jnp.asarray(rng.standard_normal((rows, n)), jnp.float32)
    tiled_gkn = jax.jit(lambda s: tiled_ragged_m(a, b, s, b_major="n", precision=_HIGHEST))
    tiled_gnk = jax.jit(lambda s: tiled_ragged_m(a, jnp.swapaxes(b, 1, 2), s, b_major="k", precision=_HIGHEST))
    tiled_k = jax.jit(lambda s: tiled_ragged_k(a, c, s, precision=_HIGHEST))
    for kind in (*sweep.GROUPINGS, "one hot") * 3:
        drawn = _one_hot(rng, rows, groups) if kind == "one hot" else sweep.group_sizes(rng, kind, groups, rows)
        sizes = clamp_group_sizes(drawn, rows)
        want = lax.ragged_dot(a, b, sizes, precision=_HIGHEST)
        want_k = lax.ragged_dot_general(a, c, sizes, _RAGGED_K, precision=_HIGHEST)
        for got, ref in ((tiled_gkn(sizes), want), (tiled_gnk(sizes), want), (tiled_k(sizes), want_k)):
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4, err_msg=f"{kind} sizes {sizes}")


@pytest.mark.parametrize("rows,groups", [(8192, 8), (4096, 128), (64, 256), (1, 1)])
def test_the_pieces_do_at_most_a_quarter_more_rows_than_the_product(rows, groups):
    tile = tile_rows(rows, groups)
    pieces = -(-rows // tile) + groups
    assert pieces * tile <= 1.25 * rows + tile + 8 * groups  # 8: a tile's rounding
    assert pieces * tile < groups * rows or groups == 1  # less than XLA's expansion


def test_the_public_op_takes_the_tiled_path_on_the_cpu():
    a = jnp.ones((64, 32), jnp.bfloat16)
    b = jnp.ones((4, 32, 16), jnp.bfloat16)
    sizes = jnp.array([10, 0, 30, 20], jnp.int32)
    assert "stablehlo.while" in jax.jit(jax_cluster.ragged_dot).lower(a, b, sizes).as_text()  # the pieces' loop
    out = jax_cluster.ragged_dot(a, b, sizes)
    np.testing.assert_array_equal(out[:60], 32)
    np.testing.assert_array_equal(out[60:], 0)
