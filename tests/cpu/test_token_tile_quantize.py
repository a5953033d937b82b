"""The token-tile quantization of the fp8 weight gradient's operands
(primitives/token_tile_quantize.py) against a numpy reference written from
its definition: each group's rows from a 128-row tile on, one scale per
tile and column (amax times 1 / the format's largest, 1 for zeros), values x /
scale clipped and rounded to nearest even, zeros between groups."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from helpers import check_kernel_default_by_arch

from jax_cluster.primitives import token_tiles
from jax_cluster.primitives.token_tile_quantize import kernel_by_default, quantize_token_tiles

SIZES = {
    "uneven, rows left over": [0, 1, 130, 0, 77, 5],
    "past the rows": [100, 200, 50],
    "negative and empty": [-5, 64, 0, 129],
    "one group": [300],
}
FORMATS = {jnp.float8_e4m3fn: ml_dtypes.float8_e4m3fn, jnp.float8_e5m2: ml_dtypes.float8_e5m2}


def reference(x, sizes, rows, dtype):
    x = np.asarray(x, np.float32)
    m, c = x.shape
    padded = np.zeros((rows, c), np.float32)
    source = aligned = 0
    for size in sizes:
        size = int(min(max(size, 0), m - source))
        padded[aligned : aligned + size] = x[source : source + size]
        source, aligned = source + size, aligned + -(-size // 128) * 128
    tiles = padded.reshape(rows // 128, 128, c)
    largest = np.float32(ml_dtypes.finfo(FORMATS[dtype]).max)
    amax = np.abs(tiles).max(axis=1)
    scales = np.where(amax > 0, amax * np.float32(1 / largest), np.float32(1)).astype(np.float32)
    values = np.clip(tiles * (np.float32(1) / scales)[:, None, :], -largest, largest).astype(FORMATS[dtype])
    return values.reshape(rows, c).T, scales


@pytest.mark.parametrize("label", list(SIZES))
@pytest.mark.parametrize("dtype", list(FORMATS))
@pytest.mark.parametrize("x_dtype", [jnp.bfloat16, jnp.float32])
def test_token_tiles_match_their_definition(label, dtype, x_dtype):
    m, c = 300, 192
    x = (jax.random.normal(jax.random.key(len(label)), (m, c)) * 3.0).astype(x_dtype)
    x = x.at[7, :64].set(0)  # a zero stretch inside a tile
    sizes = jnp.asarray(SIZES[label], jnp.int32)
    rows = token_tiles.padded_rows(m, sizes.shape[0])
    values, scales = jax.jit(quantize_token_tiles, static_argnums=(2, 3))(x, sizes, rows, dtype)
    want_values, want_scales = reference(x, SIZES[label], rows, dtype)
    assert values.shape == (c, rows) and values.dtype == dtype and scales.shape == (rows // 128, c)
    np.testing.assert_array_equal(np.asarray(scales), want_scales)
    np.testing.assert_array_equal(np.asarray(values).view(np.uint8), want_values.view(np.uint8))


def test_the_kernel_switch_keeps_the_numbers_where_no_kernel_runs():
    """use_kernel only asks: on a CPU the same primitive computes them with XLA."""
    x = jax.random.normal(jax.random.key(1), (256, 128), jnp.bfloat16)
    sizes = jnp.asarray([100, 156], jnp.int32)
    rows = token_tiles.padded_rows(256, 2)
    fused = jax.make_jaxpr(lambda x, s: quantize_token_tiles(x, s, rows, jnp.float8_e4m3fn, use_kernel=True))
    text = str(fused(x, sizes))
    assert "jax_cluster_quantize_token_tiles" in text and "use_kernel=True" in text
    ours = quantize_token_tiles(x, sizes, rows, jnp.float8_e4m3fn, use_kernel=True)
    plain = quantize_token_tiles(x, sizes, rows, jnp.float8_e4m3fn, use_kernel=False)
    for a, b in zip(ours, plain):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_the_kernel_is_the_default_only_where_its_machine_code_runs(monkeypatch):
    check_kernel_default_by_arch(kernel_by_default, monkeypatch)
    # the default binds what kernel_by_default says for the default device
    x, sizes = jnp.ones((128, 64), jnp.bfloat16), jnp.asarray([128], jnp.int32)
    text = str(jax.make_jaxpr(lambda x, s: quantize_token_tiles(x, s, 128, jnp.float8_e4m3fn))(x, sizes))
    assert f"use_kernel={kernel_by_default()}" in text


def test_a_vmapped_call_is_one_call_per_element():
    x = jax.random.normal(jax.random.key(2), (3, 256, 128), jnp.bfloat16)
    sizes = jnp.asarray([[100, 156], [0, 256], [256, 0]], jnp.int32)
    values, scales = jax.vmap(lambda x, s: quantize_token_tiles(x, s, 384, jnp.float8_e4m3fn))(x, sizes)
    assert values.shape == (3, 128, 384) and scales.shape == (3, 3, 128)
    for i in range(3):
        want_values, want_scales = reference(x[i], np.asarray(sizes[i]), 384, jnp.float8_e4m3fn)
        np.testing.assert_array_equal(np.asarray(scales[i]), want_scales)
        np.testing.assert_array_equal(np.asarray(values[i]).view(np.uint8), want_values.view(np.uint8))


def test_bad_calls_are_refused():
    x = jnp.zeros((64, 128), jnp.bfloat16)
    with pytest.raises(ValueError, match="not a multiple of 128"):
        quantize_token_tiles(x, jnp.asarray([64], jnp.int32), 200, jnp.float8_e4m3fn)
    with pytest.raises(ValueError, match="at least one group"):
        quantize_token_tiles(x, jnp.zeros((0,), jnp.int32), 128, jnp.float8_e4m3fn)
    with pytest.raises(ValueError, match="sizes int32"):
        quantize_token_tiles(x, jnp.asarray([64], jnp.int16), 128, jnp.float8_e4m3fn)
