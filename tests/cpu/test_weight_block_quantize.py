"""The weight-block quantization of the fp8 recipe's weights
(primitives/weight_block_quantize.py, ops/quantize.quantize_weight) against a
numpy reference written from its definition: one scale per 128 x 128 block
of each group's matrix (amax times 1 / the format's largest, 1 for zeros),
values w / scale clipped and rounded to nearest even, written as stored and
transposed."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from helpers import check_kernel_default_by_arch

from jax_cluster.ops.quantize import WEIGHT_BLOCK, dequantize, quantize, quantize_weight
from jax_cluster.planning.device import DeviceInfo
from jax_cluster.primitives.weight_block_quantize import (
    kernel_by_default,
    kernel_default_as,
    kernel_takes,
    quantize_weight_blocks,
)

FORMATS = {jnp.float8_e4m3fn: ml_dtypes.float8_e4m3fn, jnp.float8_e5m2: ml_dtypes.float8_e5m2}


def reference(w, dtype):
    w = np.asarray(w, np.float32)
    g, k, n = w.shape
    blocks = w.reshape(g, k // 128, 128, n // 128, 128)
    largest = np.float32(ml_dtypes.finfo(FORMATS[dtype]).max)
    amax = np.abs(blocks).max(axis=(2, 4))
    scales = np.where(amax > 0, amax * np.float32(1 / largest), np.float32(1)).astype(np.float32)
    inverse = (np.float32(1) / scales)[:, :, None, :, None]
    values = np.clip(blocks * inverse, -largest, largest).astype(FORMATS[dtype]).reshape(g, k, n)
    return values, values.transpose(0, 2, 1), scales


def _bytes(a):
    return np.asarray(a).view(np.uint8)


@pytest.mark.parametrize("dtype", list(FORMATS))
@pytest.mark.parametrize("w_dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_weight_blocks_match_their_definition(dtype, w_dtype):
    w = (jax.random.normal(jax.random.key(0), (3, 256, 384)) * 4.0).astype(w_dtype)
    w = w.at[1, :128, 128:256].set(0)  # an all-zero block: scale 1
    w = w.at[2, 5, 300].set(1e-30)  # a block of zeros but one denormal-sized value
    kn, nk, scales = jax.jit(quantize_weight_blocks, static_argnums=1)(w, dtype)
    want_kn, want_nk, want_scales = reference(w, dtype)
    assert kn.shape == (3, 256, 384) and nk.shape == (3, 384, 256) and scales.shape == (3, 2, 3)
    assert kn.dtype == nk.dtype == dtype and scales.dtype == jnp.float32
    assert np.asarray(scales)[1, 0, 1] == 1.0
    np.testing.assert_array_equal(np.asarray(scales), want_scales)
    np.testing.assert_array_equal(_bytes(kn), _bytes(want_kn))
    np.testing.assert_array_equal(_bytes(nk), _bytes(want_nk))


def test_a_nan_spoils_its_own_block_only():
    w = jax.random.normal(jax.random.key(1), (1, 256, 256), jnp.float32).at[0, 3, 200].set(jnp.nan)
    kn, _, scales = quantize_weight_blocks(w, jnp.float8_e4m3fn)
    # (whether its block's amax is NaN, scale 1, depends on XLA's max on the platform;
    # the GPU test holds the kernel to XLA's GPU form there)
    assert np.isfinite(np.asarray(scales)).all()
    assert np.isnan(np.asarray(kn, np.float32)[0, 3, 200])
    assert np.isfinite(np.asarray(kn, np.float32)[0, :, :128]).all()
    assert np.isfinite(np.asarray(kn, np.float32)[0, 128:]).all()


def test_quantize_weight_gives_both_layouts_with_shared_scales():
    w = jax.random.normal(jax.random.key(2), (256, 384), jnp.float32)
    as_stored, transposed = quantize_weight(w)
    assert as_stored.qvalue.shape == (256, 384) and as_stored.scale.shape == (2, 3)
    assert transposed.qvalue.shape == (384, 256) and transposed.scale.shape == (3, 2)
    np.testing.assert_array_equal(np.asarray(dequantize(as_stored)), np.asarray(dequantize(transposed)).T)
    # float32 weights: the same numbers as quantize()'s under jit, where XLA turns qwix's
    # division by the format's largest value into our product with its float32 reciprocal
    # (eager dispatch may divide exactly, one ulp apart)
    q = jax.jit(lambda w: quantize(w, block=WEIGHT_BLOCK))(w)
    np.testing.assert_array_equal(_bytes(as_stored.qvalue), _bytes(q.qvalue))
    np.testing.assert_array_equal(np.asarray(as_stored.scale), np.asarray(q.scale))


def test_bf16_weights_round_within_one_step_of_quantize():
    """quantize() divides in bf16 (qwix's rule), quantize_weight in float32:
    a value may land one fp8 step apart, never more."""
    w = jax.random.normal(jax.random.key(3), (2, 256, 256), jnp.bfloat16)
    ours, q = quantize_weight(w)[0], quantize(w, block=WEIGHT_BLOCK)
    a, b = np.asarray(dequantize(ours)), np.asarray(dequantize(q))
    step = np.abs(np.asarray(w, np.float32)) * 2.0**-3 + 1e-6  # e4m3 has 3 mantissa bits
    assert (np.abs(a - b) <= step).all()
    ref = np.asarray(w, np.float32)
    assert np.linalg.norm(a - ref) <= np.linalg.norm(b - ref) * 1.01


def test_a_vmapped_stack_is_more_groups():
    w = jax.random.normal(jax.random.key(4), (2, 3, 128, 256), jnp.bfloat16)
    outs = jax.vmap(lambda v: quantize_weight_blocks(v, jnp.float8_e4m3fn))(w)
    flat = quantize_weight_blocks(w.reshape(6, 128, 256), jnp.float8_e4m3fn)
    for got, want in zip(outs, flat):
        assert got.shape == (2, 3, *want.shape[1:])
        np.testing.assert_array_equal(_bytes(np.asarray(got).reshape(want.shape)), _bytes(want))


def test_the_kernel_switch_keeps_the_numbers_where_no_kernel_runs():
    w = jax.random.normal(jax.random.key(5), (1, 128, 256), jnp.bfloat16)
    text = str(jax.make_jaxpr(lambda w: quantize_weight_blocks(w, jnp.float8_e4m3fn, use_kernel=True))(w))
    assert "jax_cluster_quantize_weight_blocks" in text and "use_kernel=True" in text
    ours = quantize_weight_blocks(w, jnp.float8_e4m3fn, use_kernel=True)
    plain = quantize_weight_blocks(w, jnp.float8_e4m3fn, use_kernel=False)
    for a, b in zip(ours, plain):
        np.testing.assert_array_equal(_bytes(a), _bytes(b))


def test_the_kernel_is_the_default_only_where_its_machine_code_runs(monkeypatch):
    check_kernel_default_by_arch(kernel_by_default, monkeypatch)
    w = jnp.ones((1, 128, 128), jnp.bfloat16)
    text = str(jax.make_jaxpr(lambda w: quantize_weight_blocks(w, jnp.float8_e4m3fn))(w))
    assert f"use_kernel={kernel_by_default()}" in text
    hopper = DeviceInfo("cuda", compute_capability=(9, 0))
    with kernel_default_as(False):  # a benchmark's switch, nested
        assert not kernel_by_default(hopper)
        with kernel_default_as(True):  # still only where the machine code runs
            assert kernel_by_default(hopper) and not kernel_by_default(DeviceInfo("cuda", compute_capability=(12, 0)))
        assert not kernel_by_default(hopper)
    assert kernel_by_default(hopper)


def test_the_kernel_takes_only_what_one_launch_covers():
    def takes(shape, w_dtype=jnp.bfloat16, dtype=jnp.float8_e4m3fn):
        return kernel_takes(jax.ShapeDtypeStruct(shape, w_dtype), dtype)

    assert takes((256, 7168, 2048)) and takes((1, 128, 128), jnp.float32, jnp.float8_e5m2)
    assert not takes((70000, 128, 128))  # more groups than a grid's z holds: XLA's form
    assert not takes((1, 128 * 70000, 128))
    assert not takes((1, 128, 128), jnp.float64) and not takes((1, 128, 128), dtype=jnp.int8)


def test_bad_calls_are_refused():
    with pytest.raises(ValueError, match="multiples of 128"):
        quantize_weight_blocks(jnp.zeros((1, 128, 200), jnp.bfloat16), jnp.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"\[G, K, N\]"):
        quantize_weight_blocks(jnp.zeros((128, 128), jnp.bfloat16), jnp.float8_e4m3fn)
    with pytest.raises(TypeError, match="float8_e4m3fn or float8_e5m2"):
        quantize_weight_blocks(jnp.zeros((1, 128, 128), jnp.bfloat16), jnp.int8)
    with pytest.raises(ValueError, match="quantize_weight: w must be"):
        quantize_weight(jnp.zeros((100, 128), jnp.float32))
    with pytest.raises(ValueError, match="quantize_weight: w must be"):
        quantize_weight(jnp.zeros((2, 2, 128, 128), jnp.float32))
    with pytest.raises(TypeError, match="quantize_weight: dtype"):
        quantize_weight(jnp.zeros((128, 128), jnp.float32), jnp.bfloat16)
