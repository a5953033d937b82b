"""MXFP8 operands: `quantize` in 32-value blocks with e8m0 scales, the scales'
reordering for the sm100f kernel (checked against CUTLASS's own layout in
tests/native/test_mx_scale_layout.py), the plans MX calls get, the products
through the primitive's fallback and the dequantized path, and the errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_cluster
from jax_cluster import _ffi
from jax_cluster.ops.fp8_dense import scaled_product
from jax_cluster.planning import tables
from jax_cluster.planning.dense import plan_gemm
from jax_cluster.planning.device import DeviceInfo
from jax_cluster.primitives import mx_scales
from jax_cluster.primitives.scaled_gemm import scaled_gemm

pytest.importorskip("qwix")

B200 = DeviceInfo("cuda", "described B200", (10, 0), 148, 232448, 126 << 20)
H200 = DeviceInfo("cuda", "described H200", (9, 0), 132, 232448, 50 << 20)
E8M0 = jnp.float8_e8m0fnu


def _mx_row() -> str | None:
    names = _ffi.compiled_variant_names()
    return next((v.name for v in tables.load_menu() if v.dtype == tables.MX_DTYPE and v.name in names), None)


def _plan(m, n, k, device=B200, **kw):
    args = dict(dtype=tables.MX_DTYPE, out_dtype=jnp.bfloat16, a_major="k", b_major="k", device=device)
    return plan_gemm(m, n, k, **{**args, **kw})


@pytest.mark.parametrize("block,shape", [((1, 32), (3, 64, 96)), ((32, 1), (96, 40))])
def test_quantize_gives_power_of_two_scales_and_no_saturation(block, shape):
    x = jax.random.normal(jax.random.key(0), shape, jnp.float32) * 7.0
    q = jax_cluster.quantize(x, block=block)
    assert q.qvalue.dtype == jnp.float8_e4m3fn and q.scale.dtype == E8M0
    want = tuple(s // b for s, b in zip(shape[-2:], block))
    assert q.scale.shape == (*shape[:-2], *want)
    assert np.abs(np.asarray(q.qvalue, np.float32)).max() <= 448  # rounded up: never past e4m3's largest
    back = np.asarray(jax_cluster.dequantize(q), np.float64)
    err = np.linalg.norm(back - np.asarray(x, np.float64)) / np.linalg.norm(np.asarray(x, np.float64))
    assert err < 4e-2  # e4m3's 3 mantissa bits, a power-of-two scale losing at most one more


def test_mx_blocks_hold_e4m3_only():
    with pytest.raises(TypeError, match="MXFP8 blocks"):
        jax_cluster.quantize(jnp.ones((4, 64)), block=(1, 32), dtype=jnp.float8_e5m2)


@pytest.mark.parametrize("rows,k", [(1, 32), (130, 96), (256, 512), (300, 4128)])
def test_the_kernel_layout_round_trips(rows, k):
    blocks = -(-k // 32)
    codes = jax.random.randint(jax.random.key(rows + k), (rows, blocks), 100, 140).astype(jnp.uint8)
    scales = codes.view(E8M0)
    laid = mx_scales.to_kernel_layout(scales, k)
    assert laid.shape == (mx_scales.layout_size(rows, k),) and laid.dtype == E8M0
    np.testing.assert_array_equal(np.asarray(mx_scales.from_kernel_layout(laid, rows, k).view(jnp.uint8)), codes)


def test_the_kernel_layout_follows_the_atom_formula():
    rows, k = 260, 640
    blocks = k // 32
    codes = (np.arange(rows * blocks) % 251).reshape(rows, blocks).astype(np.uint8)
    laid = np.asarray(mx_scales.to_kernel_layout(jnp.asarray(codes).view(E8M0), k).view(jnp.uint8))
    padded_blocks = -(-blocks // 4) * 4
    for r in (0, 31, 32, 127, 128, 259):
        for kb in (0, 3, 4, 19):
            at = ((r // 128) * padded_blocks // 4 + kb // 4) * 512 + (r % 32) * 16 + ((r // 32) % 4) * 4 + kb % 4
            assert laid[at] == codes[r, kb], (r, kb)


def test_the_primitive_reads_mx_scales_in_the_kernel_layout():
    """scaled_gemm with e8m0 scales: the fallback dequantizes from the kernel's layout."""
    m, n, k = 200, 136, 256
    qx = jax_cluster.quantize(jax.random.normal(jax.random.key(1), (m, k), jnp.float32), block=(1, 32))
    qw = jax_cluster.quantize(jax.random.normal(jax.random.key(2), (n, k), jnp.float32), block=(1, 32))
    sa, sb = (mx_scales.to_kernel_layout(q.scale, k) for q in (qx, qw))
    out = jax.jit(lambda *xs: scaled_gemm(*xs, out_dtype=jnp.float32))(qx.qvalue, qw.qvalue, sa, sb)
    ref = np.asarray(jax_cluster.dequantize(qx), np.float64) @ np.asarray(jax_cluster.dequantize(qw), np.float64).T
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-4 * np.abs(ref).max())


def test_bad_mx_scales_are_refused_at_trace_time():
    a = jnp.zeros((64, 256), jnp.float8_e4m3fn)
    b = jnp.zeros((32, 256), jnp.float8_e4m3fn)
    sa = jnp.zeros((mx_scales.layout_size(64, 256),), E8M0)
    sb = jnp.zeros((mx_scales.layout_size(32, 256),), E8M0)
    with pytest.raises(ValueError, match=r"scale_b must be float8_e8m0fnu \[1024\]"):
        jax.eval_shape(scaled_gemm, a, b, sa, sb[:512])
    with pytest.raises(ValueError, match="MX operands need K a multiple of 128"):
        jax.eval_shape(scaled_gemm, a[:, :96], b[:, :96], sa, sb)


@pytest.mark.skipif(_mx_row() is None, reason="the extension has no compiled MX row")
def test_blackwell_plans_take_the_mx_row_and_hopper_explains_why_not():
    p = _plan(4096, 4096, 4096)
    assert p.path == "kernel" and p.variant == _mx_row() and p.schedule == "clc" and p.dtype == "mxe4m3"
    assert _plan(6, 4096, 4096).path == "kernel"  # MX scales are padded: any M
    short = _plan(256, 256, 96)
    assert short.path == "xla" and "K tile 128" in short.reason
    hopper = _plan(4096, 4096, 4096, device=H200)
    assert hopper.path == "xla" and "no compiled sm90a variant for mxe4m3" in hopper.reason


@pytest.mark.skipif(_mx_row() is None, reason="the extension has no compiled MX row")
@pytest.mark.parametrize("weight_layout", ["kn", "nk"])
def test_a_pinned_mx_plan_lays_out_operands_and_scales_the_kernel_way(weight_layout):
    """matmul / dot_general of MX QArrays under the MX kernel's plan bind the
    scaled primitive with reordered scales; off CUDA its fallback computes."""
    m, n, k = 96, 256, 384
    x = jax.random.normal(jax.random.key(3), (2, m // 2, k), jnp.float32)
    w = jax.random.normal(jax.random.key(4), (k, n) if weight_layout == "kn" else (n, k), jnp.float32)
    qx = jax_cluster.quantize(x, block=(1, 32))
    qw = jax_cluster.quantize(w, block=(32, 1) if weight_layout == "kn" else (1, 32))
    plan = _plan(m, n, k)
    contracting = 0 if weight_layout == "kn" else 1
    run = jax.jit(lambda a, b: scaled_product(a, b, contracting, jnp.bfloat16, plan))
    assert "jax_cluster_scaled_gemm" in str(jax.make_jaxpr(run)(qx, qw))
    values = np.asarray(jax_cluster.dequantize(qw), np.float64)
    ref = np.asarray(jax_cluster.dequantize(qx), np.float64) @ (values if weight_layout == "kn" else values.T)
    out = run(qx, qw)
    assert out.shape == (2, m // 2, n) and out.dtype == jnp.bfloat16
    assert np.linalg.norm(np.asarray(out, np.float64) - ref) / np.linalg.norm(ref) < 5e-3
    if weight_layout == "kn":  # matmul takes the same plan
        via_matmul = jax.jit(lambda a, b: jax_cluster.matmul(a, b, plan=plan))(qx, qw)
        np.testing.assert_array_equal(np.asarray(via_matmul), np.asarray(out))


def test_mx_operands_without_a_kernel_plan_take_the_dequantized_path():
    x = jax.random.normal(jax.random.key(5), (64, 256), jnp.float32)
    w = jax.random.normal(jax.random.key(6), (256, 128), jnp.float32)
    qx, qw = jax_cluster.quantize(x, block=(1, 32)), jax_cluster.quantize(w, block=(32, 1))
    out = jax_cluster.matmul(qx, qw)  # a CPU: no kernel plan
    assert "jax_cluster_scaled_gemm" not in str(jax.make_jaxpr(jax_cluster.matmul)(qx, qw))
    ref = np.asarray(jax_cluster.dequantize(qx), np.float64) @ np.asarray(jax_cluster.dequantize(qw), np.float64)
    assert np.linalg.norm(np.asarray(out, np.float64) - ref) / np.linalg.norm(ref) < 1e-2
    groups = jax.random.normal(jax.random.key(7), (4, 256, 128), jnp.float32)
    sizes = jnp.asarray([10, 20, 0, 34], jnp.int32)
    grouped = jax_cluster.ragged_dot(qx, jax_cluster.quantize(groups, block=(32, 1)), sizes)
    assert grouped.shape == (64, 128) and grouped.dtype == jnp.bfloat16


def test_formats_and_blocks_that_do_not_pair_are_errors():
    x = jax.random.normal(jax.random.key(8), (64, 256), jnp.float32)
    w = jax.random.normal(jax.random.key(9), (256, 128), jnp.float32)
    mx, blockwise = jax_cluster.quantize(x, block=(1, 32)), jax_cluster.quantize(w, block=(128, 128))
    with pytest.raises(TypeError, match="rhs's scales must be float8_e8m0fnu"):
        jax_cluster.matmul(mx, blockwise)
    with pytest.raises(ValueError, match=r"lhs must be scaled in 1x32 blocks"):
        jax_cluster.matmul(jax_cluster.quantize(x, block=(32, 1)), jax_cluster.quantize(w, block=(32, 1)))
