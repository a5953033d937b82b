"""MXFP8 grouped products: ragged_m (each group's A scales on a row tile of
the grouped layout) and the weight gradient (ragged_k over block-aligned
tokens), the primitive's float32 fallback, its trace-time checks, and the
planner's choice of the sm100f MX grouped rows."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_cluster
from jax_cluster import _ffi
from jax_cluster.ops.fp8_grouped import mx_weight_gradient, scaled_grouped_product
from jax_cluster.planning import tables
from jax_cluster.planning.device import DeviceInfo
from jax_cluster.primitives import mx_scales, token_tiles
from jax_cluster.primitives.lowering import clamp_group_sizes
from jax_cluster.primitives.scaled_ragged import scaled_ragged_dot, scaled_ragged_k_dot

pytest.importorskip("qwix")

B200 = DeviceInfo("cuda", "described B200", (10, 0), 148, 232448, 126 << 20)
H200 = DeviceInfo("cuda", "described H200", (9, 0), 132, 232448, 50 << 20)
E8M0 = jnp.float8_e8m0fnu
# sizes that leave rows over, hold empty and one-row groups, or ask for more rows than there are
SIZES = {
    "uneven, rows left over": [0, 1, 130, 0, 77, 5],
    "past the rows": [100, 200, 50],
    "negative and empty": [-5, 64, 0, 129],
}


def _grouped_mx_row() -> str | None:
    names = _ffi.compiled_variant_names()
    rows = (v for v in tables.load_menu() if v.dtype == tables.MX_DTYPE and v.problem == "ragged_m")
    return next((v.name for v in rows if v.name in names), None)


def _plan(rows, n, k, groups, device=B200, problem="ragged_m"):
    return jax_cluster.plan_ragged(
        *((rows, n, k) if problem == "ragged_m" else (k, n, rows)),
        groups,
        problem=problem,
        dtype=tables.MX_DTYPE,
        out_dtype=jnp.bfloat16,
        a_major="k",
        b_major="k",
        device=device,
    )


def _codes(key, rows, k):
    return jax.random.randint(key, (rows, -(-k // 32)), 100, 140).astype(jnp.uint8)


@pytest.mark.parametrize("label", list(SIZES))
def test_each_group_reads_its_own_scale_layout_from_a_row_tile(label):
    """Group g's scales, from byte aligned_start * row bytes on, are the
    dense layout of its own rows: what the kernel's per-group pointer and
    layout (tile_atom_to_shape_SFA of the group's shape) read."""
    rows, k = 300, 416
    sizes = clamp_group_sizes(jnp.asarray(SIZES[label], jnp.int32), rows)
    codes = _codes(jax.random.key(0), rows, k)
    laid = mx_scales.grouped_to_kernel_layout(codes.view(E8M0), sizes, k)
    assert laid.shape == (mx_scales.grouped_layout_size(rows, sizes.shape[0], k),)
    row_bytes = mx_scales.padded_shape(1, k)[1]
    starts, spans = token_tiles.group_starts(sizes, token_tiles.padded_rows(rows, sizes.shape[0]))
    first = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    flat = np.asarray(laid.view(jnp.uint8))
    for g, (start, size) in enumerate(zip(np.asarray(starts), np.asarray(spans))):
        assert start % 128 == 0
        if size == 0:
            continue
        own = mx_scales.to_kernel_layout(codes[first[g] : first[g] + size].view(E8M0), k).view(jnp.uint8)
        np.testing.assert_array_equal(flat[start * row_bytes : start * row_bytes + own.shape[0]], np.asarray(own))


@pytest.mark.parametrize("label", list(SIZES))
def test_the_grouped_layout_round_trips(label):
    rows, k = 300, 256
    sizes = clamp_group_sizes(jnp.asarray(SIZES[label], jnp.int32), rows)
    codes = _codes(jax.random.key(1), rows, k)
    laid = mx_scales.grouped_to_kernel_layout(codes.view(E8M0), sizes, k)
    back = np.asarray(mx_scales.grouped_from_kernel_layout(laid, sizes, rows, k).view(jnp.uint8))
    inside = np.arange(rows) < int(np.sum(sizes))
    np.testing.assert_array_equal(back[inside], np.asarray(codes)[inside])
    assert (back[~inside] == mx_scales.ONE).all()  # rows past every group: 1.0


def _operands(key, rows, n, k, groups, rhs_layout):
    kx, kw = jax.random.split(key)
    x = jax.random.normal(kx, (rows, k), jnp.float32)
    w = jax.random.normal(kw, (groups, k, n) if rhs_layout == "gkn" else (groups, n, k), jnp.float32)
    qx = jax_cluster.quantize(x, block=(1, 32))
    qw = jax_cluster.quantize(w, block=(32, 1) if rhs_layout == "gkn" else (1, 32))
    return qx, qw


def _reference(qx, qw, sizes, rhs_layout):
    """float64 grouped product of the dequantized operands, rows past the groups zero."""
    x = np.asarray(jax_cluster.dequantize(qx), np.float64)
    w = np.asarray(jax_cluster.dequantize(qw), np.float64)
    if rhs_layout == "gnk":
        w = w.transpose(0, 2, 1)
    out = np.zeros((x.shape[0], w.shape[2]))
    start = 0
    for g, size in enumerate(np.asarray(clamp_group_sizes(jnp.asarray(sizes, jnp.int32), x.shape[0]))):
        out[start : start + size] = x[start : start + size] @ w[g]
        start += size
    return out


@pytest.mark.parametrize("label", list(SIZES))
def test_the_primitive_falls_back_to_the_dequantized_grouped_product(label):
    rows, n, k = 300, 136, 256
    sizes = jnp.asarray(SIZES[label], jnp.int32)
    groups = sizes.shape[0]
    qx, qw = _operands(jax.random.key(2), rows, n, k, groups, "gnk")
    clamped = clamp_group_sizes(sizes, rows)
    sa = mx_scales.grouped_to_kernel_layout(qx.scale, clamped, k)
    sb = jax.vmap(lambda s: mx_scales.to_kernel_layout(s, k))(qw.scale)
    run = jax.jit(lambda *xs: scaled_ragged_dot(*xs, out_dtype=jnp.float32))
    out = np.asarray(run(qx.qvalue, qw.qvalue, sa, sb, sizes))
    ref = _reference(qx, qw, sizes, "gnk")
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4 * np.abs(ref).max())
    covered = int(np.sum(clamped))
    assert (out[covered:] == 0).all()


def test_bad_grouped_mx_scales_are_refused_at_trace_time():
    rows, n, k, groups = 200, 64, 256, 3
    a = jnp.zeros((rows, k), jnp.float8_e4m3fn)
    b = jnp.zeros((groups, n, k), jnp.float8_e4m3fn)
    sizes = jnp.zeros((groups,), jnp.int32)
    sa = jnp.zeros((mx_scales.grouped_layout_size(rows, groups, k),), E8M0)
    sb = jnp.zeros((groups, mx_scales.layout_size(n, k)), E8M0)
    jax.eval_shape(scaled_ragged_dot, a, b, sa, sb, sizes)
    dense_size = mx_scales.layout_size(rows, k)  # the dense layout leaves no room for the groups' tiles
    with pytest.raises(ValueError, match=rf"scale_a must be float8_e8m0fnu \[{sa.shape[0]}\]"):
        jax.eval_shape(scaled_ragged_dot, a, b, sa[:dense_size], sb, sizes)
    with pytest.raises(ValueError, match="scale_b must be float8_e8m0fnu"):
        jax.eval_shape(scaled_ragged_dot, a, b, sa, sb[:2], sizes)
    with pytest.raises(ValueError, match="MX operands need K a multiple of 128"):
        jax.eval_shape(scaled_ragged_dot, a[:, :96], b[..., :96], sa, sb, sizes)


@pytest.mark.skipif(_grouped_mx_row() is None, reason="the extension has no compiled MX grouped row")
def test_blackwell_plans_take_the_mx_grouped_row_and_explain_what_they_refuse():
    p = _plan(4096, 2048, 7168, 8)
    assert p.path == "kernel" and p.variant == _grouped_mx_row() and p.schedule == "clc"
    assert _plan(4099, 2048, 7168, 8).path == "kernel"  # MX scales are padded per group: any rows
    short = _plan(4096, 256, 96, 8)
    assert short.path == "xla" and "K tile 128" in short.reason
    wgrad = _plan(4096, 2048, 7168, 8, problem="ragged_k")
    assert wgrad.path == "kernel" and wgrad.problem == "ragged_k" and wgrad.schedule == "clc"
    hopper = _plan(4096, 2048, 7168, 8, device=H200)
    assert hopper.path == "xla" and "no compiled sm90a ragged_m variant for mxe4m3" in hopper.reason


@pytest.mark.skipif(_grouped_mx_row() is None, reason="the extension has no compiled MX grouped row")
@pytest.mark.parametrize("rhs_layout", ["gkn", "gnk"])
def test_a_pinned_mx_grouped_plan_lays_out_scales_the_kernel_way(rhs_layout):
    """ragged_dot of MX QArrays under the MX grouped plan binds the scaled
    grouped primitive with reordered scales; off CUDA its fallback computes."""
    rows, n, k = 300, 256, 384
    sizes = jnp.asarray(SIZES["uneven, rows left over"], jnp.int32)
    qx, qw = _operands(jax.random.key(3), rows, n, k, sizes.shape[0], rhs_layout)
    plan = _plan(rows, n, k, sizes.shape[0])
    run = jax.jit(lambda a, b, s: scaled_grouped_product(a, b, s, rhs_layout, jnp.bfloat16, plan))
    assert "jax_cluster_scaled_ragged_dot" in str(jax.make_jaxpr(run)(qx, qw, sizes))
    ref = _reference(qx, qw, sizes, rhs_layout)
    out = np.asarray(run(qx, qw, sizes), np.float64)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 5e-3
    via_op = jax.jit(lambda a, b, s: jax_cluster.ragged_dot(a, b, s, rhs_layout=rhs_layout, plan=plan))
    np.testing.assert_array_equal(np.asarray(via_op(qx, qw, sizes), np.float64), out)


def test_mx_grouped_operands_scaled_across_n_take_the_dequantized_path():
    """A "gkn" weight quantized in (1, 32) blocks shares scales along N, which
    the kernel cannot read: no kernel call, the dequantized product instead."""
    rows, n, k = 64, 128, 256
    sizes = jnp.asarray([10, 20, 0, 34], jnp.int32)
    qx = jax_cluster.quantize(jax.random.normal(jax.random.key(4), (rows, k)), block=(1, 32))
    qw = jax_cluster.quantize(jax.random.normal(jax.random.key(5), (4, k, n)), block=(1, 32))
    assert scaled_grouped_product(qx, qw, sizes, "gkn", jnp.bfloat16, None) is None
    out = jax_cluster.ragged_dot(qx, qw, sizes)
    ref = _reference(qx, qw, sizes, "gkn")
    assert np.linalg.norm(np.asarray(out, np.float64) - ref) / np.linalg.norm(ref) < 1e-2


def _mx_wgrad_row() -> str:
    return next(v.name for v in tables.load_menu() if v.dtype == tables.MX_DTYPE and v.problem == "ragged_k")


@pytest.mark.skipif(
    _mx_wgrad_row() not in _ffi.compiled_variant_names(), reason="the extension has no compiled MX ragged_k row"
)
@pytest.mark.parametrize("label", list(SIZES))
def test_the_mx_weight_gradient_is_each_groups_product_of_its_block_aligned_tokens(label):
    """Under the MX ragged_k plan, x and dy go to the block-aligned rows in
    32-row e8m0 blocks, one kernel layout per operand; off CUDA the
    primitive's fallback computes each group's x^T dy from exactly those values."""
    rows, k, n = 300, 256, 128
    sizes = jnp.asarray(SIZES[label], jnp.int32)
    groups = sizes.shape[0]
    kx, kd = jax.random.split(jax.random.key(6))
    x, dy = jax.random.normal(kx, (rows, k)), jax.random.normal(kd, (rows, n))
    padded = token_tiles.padded_rows(rows, groups)
    plan = _plan(padded, n, k, groups, problem="ragged_k")
    assert plan.variant == _mx_wgrad_row()
    run = jax.jit(lambda x, dy, s: mx_weight_gradient(x, dy, s, jnp.bfloat16, plan))  # the row writes bf16
    assert "jax_cluster_scaled_ragged_dot" in str(jax.make_jaxpr(run)(x, dy, sizes))
    out = np.asarray(run(x, dy, sizes), np.float64)
    # the reference: the same MXFP8 rounding of the block-aligned rows, then float64 per group
    clamped = clamp_group_sizes(sizes, rows)
    laid = [
        jax_cluster.dequantize(jax_cluster.quantize(token_tiles.laid_out(v, clamped, padded).T, block=(1, 32)))
        for v in (x, dy)
    ]
    xs, dys = (np.asarray(v, np.float64).T for v in laid)
    starts, spans = (np.asarray(a) for a in token_tiles.group_starts(clamped, padded))
    for g in range(groups):
        part = slice(starts[g], starts[g] + spans[g])
        want = xs[part].T @ dys[part]
        np.testing.assert_allclose(out[g], want, rtol=1e-2, atol=1e-2 * max(np.abs(want).max(), 1.0))
    # and MXFP8's rounding stays near the unquantized product
    first = np.concatenate([[0], np.cumsum(clamped)[:-1]])
    exact = np.stack(
        [np.asarray(x, np.float64)[f : f + s].T @ np.asarray(dy, np.float64)[f : f + s] for f, s in zip(first, clamped)]
    )
    assert np.linalg.norm(out - exact) / max(np.linalg.norm(exact), 1e-30) < 6e-2


def test_no_mx_weight_gradient_without_a_plan_that_takes_it():
    x, dy = jnp.ones((64, 128)), jnp.ones((64, 128))
    assert mx_weight_gradient(x, dy, jnp.asarray([32, 32], jnp.int32), jnp.float32, None) is None  # the CPU


def test_bad_mx_weight_gradient_scales_are_refused_at_trace_time():
    m, n, rows, groups = 256, 128, 384, 2
    a = jnp.zeros((m, rows), jnp.float8_e4m3fn)
    b = jnp.zeros((n, rows), jnp.float8_e4m3fn)
    sizes = jnp.zeros((groups,), jnp.int32)
    sa = jnp.zeros((mx_scales.layout_size(m, rows),), E8M0)
    sb = jnp.zeros((mx_scales.layout_size(n, rows),), E8M0)
    assert jax.eval_shape(scaled_ragged_k_dot, a, b, sa, sb, sizes).shape == (groups, m, n)
    with pytest.raises(ValueError, match=rf"scale_a must be float8_e8m0fnu \[{sa.shape[0]}\]"):
        jax.eval_shape(scaled_ragged_k_dot, a, b, sa[:-16], sb, sizes)
    with pytest.raises(ValueError, match="scale_b must be float8_e8m0fnu"):
        jax.eval_shape(scaled_ragged_k_dot, a, b, sa, sb[:-16], sizes)
    with pytest.raises(ValueError, match="each block.s rows must be a multiple of 128"):
        jax.eval_shape(scaled_ragged_k_dot, a[:, :320], b[:, :320], sa, sb, sizes)
