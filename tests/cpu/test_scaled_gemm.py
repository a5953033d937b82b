"""The block-scaled fp8 GEMM: its fallback against a float64 product of the
dequantized operands, its trace-time checks, and the plans it gets (the
kernel row on Hopper, XLA's float32 path where a rule keeps it off)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_cluster
from jax_cluster import _ffi
from jax_cluster.planning import tables
from jax_cluster.planning.dense import plan_gemm
from jax_cluster.planning.device import DeviceInfo
from jax_cluster.primitives.scaled_gemm import scaled_gemm
from jax_cluster.tools.selftest import scaled_operands

E4M3 = jnp.float8_e4m3fn
H200 = DeviceInfo("cuda", "described H200", (9, 0), 132, 232448, 50 << 20)
TILE = (128, 128, 128)  # the block-scaled rows' tile


def _dequantized_product(a, b, scale_a, scale_b):
    block = tables.SCALE_BLOCK
    a = np.asarray(a, np.float64) * np.repeat(np.asarray(scale_a, np.float64).T, block, axis=1)
    per_row = np.repeat(np.asarray(scale_b, np.float64).T, block, axis=0)[: b.shape[0]]
    b = np.asarray(b, np.float64) * np.repeat(per_row, block, axis=1)
    return a @ b.T


@pytest.mark.parametrize("m,n,k", [(4, 24, 128), (132, 136, 256), (256, 200, 384)])
def test_the_fallback_is_the_product_of_the_dequantized_operands(m, n, k):
    operands = scaled_operands(jax.random.key(m + n + k), m, n, k, E4M3)
    out = jax.jit(lambda *xs: scaled_gemm(*xs, out_dtype=jnp.float32))(*operands)
    ref = _dequantized_product(*operands)
    assert out.shape == (m, n) and out.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-4 * np.abs(ref).max())
    bf16 = scaled_gemm(*operands)  # eager call, bfloat16 by default
    assert bf16.dtype == jnp.bfloat16
    assert np.linalg.norm(np.asarray(bf16, np.float64) - ref) / np.linalg.norm(ref) < 5e-3


def test_bad_operands_are_refused_at_trace_time():
    a, b, sa, sb = scaled_operands(jax.random.key(0), 8, 256, 256, E4M3)
    cases = [
        ((a[:, :200], b[:, :200], sa, sb), ValueError, "multiple of the scale block"),
        ((a, b[:, :128], sa, sb), ValueError, "contracting dimensions differ"),
        ((a.astype(jnp.bfloat16), b, sa, sb), TypeError, "must hold fp8 values"),
        ((a, b.astype(jnp.float8_e5m2), sa, sb), TypeError, r"b must hold fp8 values \(float8_e4m3fn\)"),
        ((a, b, sa.T, sb), ValueError, r"scale_a must be float32 \[2, 8\]"),
        ((a, b, sa, sb.astype(jnp.bfloat16)), ValueError, "scale_b must be float32"),
        ((a[None], b, sa, sb), ValueError, r"a must be \[M, K\]"),
    ]
    for operands, error, match in cases:
        with pytest.raises(error, match=match):
            jax.eval_shape(lambda *xs: scaled_gemm(*xs), *operands)
    with pytest.raises(TypeError, match="output must be one of"):
        jax.eval_shape(lambda *xs: scaled_gemm(*xs, out_dtype=jnp.float16), a, b, sa, sb)
    assert jax.eval_shape(lambda *xs: scaled_gemm(*xs, out_dtype=jnp.float32), a, b, sa, sb).dtype == jnp.float32


def _compiled_scaled_row() -> str | None:
    names = _ffi.compiled_variant_names()
    return next((v.name for v in tables.load_menu() if v.dtype in tables.BLOCK_SCALED_DTYPES and v.name in names), None)


def _plan(m, n, k, out_dtype=jnp.bfloat16, **kw):
    return plan_gemm(m, n, k, dtype=E4M3, out_dtype=out_dtype, a_major="k", b_major="k", device=H200, **kw)


@pytest.mark.skipif(_compiled_scaled_row() is None, reason="the extension has no compiled block-scaled row")
def test_hopper_plans_take_the_block_scaled_row_and_never_route_to_xla():
    for m, n, k in ((4096, 4096, 4096), (8, 7168, 2048), (65536, 2048, 7168), (2048, 2048, 2048)):
        p = _plan(m, n, k)
        assert p.path == "kernel" and "blockwise" in p.variant, (m, n, k, p.reason)
        assert _plan(m, n, k, variant=_compiled_scaled_row()).variant == _compiled_scaled_row()
        assert p.schedule == "static" and p.dtype == "e4m3" and p.out_dtype == "bf16"
        wide = _plan(m, n, k, out_dtype=jnp.float32, tile=TILE)  # the weight gradient's fp32 output
        assert wide.path == "kernel" and wide.out_dtype == "f32" and wide.variant != p.variant
    text = _plan(4096, 4096, 4096, tile=TILE).explain()
    assert "e4m3" in text and "1978 TFLOP/s" in text  # fp8 tensor cores: twice bf16's 989
    assert "fallback: the ops' bf16 path on the dequantized operands" in text


@pytest.mark.parametrize(
    "shape,kw,why",
    [
        ((6, 256, 256), {}, "M = 6 is not a multiple of 4"),
        ((8, 256, 200), {}, "not a multiple of the scale block"),
        ((8, 256, 256), {"out_dtype": jnp.float16}, "write bf16 or f32 from e4m3 inputs"),
        ((8, 256, 256), {"b_major": "n"}, "reads A [M,K] and B [N,K]"),
        ((8, 256, 256), {"epilogue": "bias_act"}, "plain products only"),
    ],
)
def test_calls_the_kernel_cannot_take_are_explained(shape, kw, why):
    if not _ffi.with_kernels():
        pytest.skip(_ffi.why_no_kernels())
    args = dict(dtype=E4M3, out_dtype=jnp.bfloat16, a_major="k", b_major="k", device=H200, tile=TILE)
    args.update(kw)
    p = plan_gemm(*shape, **args)
    assert p.path == "xla" and why in p.reason


def test_quantized_matmul_on_the_cpu_keeps_the_dequantized_path():
    x = jax.random.normal(jax.random.key(1), (256, 512), jnp.float32)
    w = jax.random.normal(jax.random.key(2), (512, 384), jnp.float32)
    qx, qw = jax_cluster.quantize(x), jax_cluster.quantize(w, block=(128, 128))
    out = jax_cluster.matmul(qx, qw)
    ref = jax_cluster.dequantize(qx) @ jax_cluster.dequantize(qw)
    assert out.dtype == jnp.bfloat16
    assert np.linalg.norm(np.asarray(out, np.float64) - np.asarray(ref)) / np.linalg.norm(np.asarray(ref)) < 1e-2


@pytest.mark.skipif(_compiled_scaled_row() is None, reason="the extension has no compiled block-scaled row")
@pytest.mark.parametrize("weight_layout", ["kn", "nk"])
def test_a_pinned_kernel_plan_lays_out_the_operands_and_scales_the_kernel_way(weight_layout):
    """The op's transposes of values and scales, checked through the primitive's
    fallback (which a kernel plan lowers to off CUDA) against the dequantized product."""
    from jax_cluster.ops.fp8_dense import scaled_product

    m, n, k = 132, 384, 512
    x = jax.random.normal(jax.random.key(3), (2, m // 2, k), jnp.float32)  # leading axes fold into M
    w = jax.random.normal(jax.random.key(4), (k, n) if weight_layout == "kn" else (n, k), jnp.float32)
    qx, qw = jax_cluster.quantize(x), jax_cluster.quantize(w, block=(128, 128))
    plan = _plan(m, n, k, tile=TILE)
    assert plan.path == "kernel"
    out = jax.jit(lambda a, b: scaled_product(a, b, 0 if weight_layout == "kn" else 1, jnp.bfloat16, plan))(qx, qw)
    values = np.asarray(jax_cluster.dequantize(qw), np.float64)
    ref = np.asarray(jax_cluster.dequantize(qx), np.float64) @ (values if weight_layout == "kn" else values.T)
    assert out.shape == (2, m // 2, n) and out.dtype == jnp.bfloat16
    assert np.linalg.norm(np.asarray(out, np.float64) - ref) / np.linalg.norm(ref) < 5e-3
    if weight_layout == "kn":  # matmul takes the same plan
        via_matmul = jax.jit(lambda a, b: jax_cluster.matmul(a, b, plan=plan))(qx, qw)
        np.testing.assert_array_equal(np.asarray(via_matmul), np.asarray(out))


def test_vmap_runs_one_product_per_element():
    a, b, scale_a, scale_b = scaled_operands(jax.random.key(7), 64, 128, 256, E4M3)
    flipped = (a[::-1], scale_a[:, ::-1])
    run = jax.vmap(lambda a, sa: scaled_gemm(a, b, sa, scale_b, out_dtype=jnp.float32))
    out = run(jnp.stack([a, flipped[0]]), jnp.stack([scale_a, flipped[1]]))
    np.testing.assert_array_equal(
        np.asarray(out[0]), np.asarray(scaled_gemm(a, b, scale_a, scale_b, out_dtype=jnp.float32))
    )
    np.testing.assert_array_equal(np.asarray(out[1]), np.asarray(out[0])[::-1])
