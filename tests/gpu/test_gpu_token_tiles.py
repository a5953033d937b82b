"""The token-tile quantization kernel (kernels/token_tile_quantize.cu) on
the GPU against the same primitive's XLA form: bitwise-equal values and
scales for every input and output format and group pattern, and the fp8
weight gradient through either form."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_cluster.ops.fp8_grouped import grouped_weight_gradient
from jax_cluster.primitives import token_tiles
from jax_cluster.primitives.token_tile_quantize import quantize_token_tiles

pytestmark = pytest.mark.gpu
SIZES = {
    "uneven, rows left over": [0, 1, 130, 0, 77, 5],
    "past the rows": [100, 200, 50],
    "negative and empty": [-5, 64, 0, 129],
    "many groups": [3, 0, 250, 17] * 40,
}


def _both(x, sizes, dtype):
    rows = token_tiles.padded_rows(x.shape[0], sizes.shape[0])
    run = jax.jit(quantize_token_tiles, static_argnums=(2, 3), static_argnames="use_kernel")
    return run(x, sizes, rows, dtype, use_kernel=True), run(x, sizes, rows, dtype, use_kernel=False)


@pytest.mark.parametrize("label", list(SIZES))
@pytest.mark.parametrize("dtype", [jnp.float8_e4m3fn, jnp.float8_e5m2])
@pytest.mark.parametrize("x_dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_the_kernel_writes_what_xla_computes(label, dtype, x_dtype):
    m, c = 700, 1088  # several 512-column blocks, the last one partial
    x = (jax.random.normal(jax.random.key(len(label)), (m, c)) * 5.0).astype(x_dtype)
    x = x.at[3, 64:200].set(0).at[5, 9].set(jnp.nan)  # a NaN spoils its tile's column, as in XLA
    sizes = jnp.asarray(SIZES[label], jnp.int32)
    (values, scales), (want_values, want_scales) = _both(x, sizes, dtype)
    np.testing.assert_array_equal(np.asarray(scales), np.asarray(want_scales))
    np.testing.assert_array_equal(np.asarray(values).view(np.uint8), np.asarray(want_values).view(np.uint8))


def test_the_kernel_leaves_no_byte_unwritten():
    """Outputs are fresh XLA buffers: a skipped element would differ between runs."""
    x = jax.random.normal(jax.random.key(1), (1000, 512), jnp.bfloat16)
    sizes = jnp.asarray([0, 300, 1, 0, 650], jnp.int32)
    (values, scales), _ = _both(x, sizes, jnp.float8_e4m3fn)
    (again, again_scales), _ = _both(x + 0, sizes, jnp.float8_e4m3fn)
    assert np.isfinite(np.asarray(scales)).all()
    np.testing.assert_array_equal(np.asarray(values).view(np.uint8), np.asarray(again).view(np.uint8))
    np.testing.assert_array_equal(np.asarray(scales), np.asarray(again_scales))


def test_the_weight_gradient_is_the_same_through_either_form():
    x = jax.random.normal(jax.random.key(2), (2048, 512), jnp.bfloat16)
    dy = jax.random.normal(jax.random.key(3), (2048, 768), jnp.bfloat16)
    sizes = jnp.asarray([500, 0, 1000, 548], jnp.int32)
    run = jax.jit(grouped_weight_gradient, static_argnums=(3, 4), static_argnames="quantize_kernel")
    fused = run(x, dy, sizes, jnp.float8_e4m3fn, jnp.bfloat16, quantize_kernel=True)
    plain = run(x, dy, sizes, jnp.float8_e4m3fn, jnp.bfloat16, quantize_kernel=False)
    np.testing.assert_array_equal(np.asarray(fused, np.float32), np.asarray(plain, np.float32))
