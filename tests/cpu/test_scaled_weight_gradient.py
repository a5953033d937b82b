"""The block-scaled fp8 weight gradient (ragged_k): the block-aligned row
layout, the fallback against a float64 product of the dequantized operands
under the size rule, its trace-time checks and plans, and the recipe's
product built on it."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_cluster import _ffi
from jax_cluster.ops.fp8_grouped import grouped_weight_gradient, token_tiled
from jax_cluster.planning import tables
from jax_cluster.planning.device import DeviceInfo
from jax_cluster.planning.grouped import plan_ragged
from jax_cluster.primitives import token_tiles
from jax_cluster.primitives.lowering import clamp_group_sizes
from jax_cluster.primitives.scaled_ragged import scaled_ragged_k_dot

E4M3 = jnp.float8_e4m3fn
H200 = DeviceInfo("cuda", "described H200", (9, 0), 132, 232448, 50 << 20)
BLOCK = tables.SCALE_BLOCK


def _operands(key, rows, m, n):
    ka, kb, ksa, ksb = jax.random.split(key, 4)
    a = jax.random.normal(ka, (m, rows), jnp.float32).astype(E4M3)
    b = jax.random.normal(kb, (n, rows), jnp.float32).astype(E4M3)
    scale_a = jax.random.uniform(ksa, (rows // BLOCK, m), jnp.float32, 0.5, 2.0)
    scale_b = jax.random.uniform(ksb, (rows // BLOCK, n), jnp.float32, 0.5, 2.0)
    return a, b, scale_a, scale_b


def _starts(sizes, rows):
    """Each group's first row: the earlier sizes rounded up to whole tiles, cut at `rows`."""
    spans = [-(-max(s, 0) // BLOCK) * BLOCK for s in sizes]
    return [min(sum(spans[:g]), rows) for g in range(len(sizes))]


def _reference(a, b, scale_a, scale_b, sizes):
    rows = a.shape[1]
    a = np.asarray(a, np.float64) * np.repeat(np.asarray(scale_a, np.float64), BLOCK, axis=0).T
    b = np.asarray(b, np.float64) * np.repeat(np.asarray(scale_b, np.float64), BLOCK, axis=0).T
    return np.stack(
        [
            a[:, s : min(s + max(n, 0), rows)] @ b[:, s : min(s + max(n, 0), rows)].T
            for s, n in zip(_starts(sizes, rows), sizes)
        ]
    )


@pytest.mark.parametrize(
    "sizes",
    [[64, 0, 100, 92, 1], [-5, 200, 0, 3], [128, 128, 256], [400, 300, 0, 0]],
    ids=["uneven", "negative", "whole-tiles", "cut-at-rows"],
)
def test_the_fallback_is_each_groups_product_of_its_aligned_rows(sizes):
    rows, m, n = 768, 136, 264
    a, b, sa, sb = _operands(jax.random.key(sum(map(abs, sizes))), rows, m, n)
    gs = jnp.asarray(sizes, jnp.int32)
    out = jax.jit(lambda *xs: scaled_ragged_k_dot(*xs, out_dtype=jnp.float32))(a, b, sa, sb, gs)
    ref = _reference(a, b, sa, sb, sizes)
    assert out.shape == (len(sizes), m, n) and out.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-4 * np.abs(ref).max())
    empty = [g for g, s in enumerate(sizes) if s <= 0]
    assert not np.asarray(out)[empty].any()


def test_the_padded_layout_holds_any_sizes_that_fit_the_rows():
    rows = 1000
    for sizes in ([1] * 64, [1000], [0] * 10, [127, 129, 1, 743], [500, -3, 500]):
        layout = token_tiles.padded_rows(rows, len(sizes))
        clamped = clamp_group_sizes(jnp.asarray(sizes, jnp.int32), rows)
        starts, got = token_tiles.group_starts(clamped, layout)
        assert (np.asarray(got) == np.asarray(clamped)).all(), sizes  # nothing is cut
        assert (np.asarray(starts) % BLOCK == 0).all()
        owner, valid = token_tiles.row_owners(clamped, layout)
        assert int(valid.sum()) == int(clamped.sum())
        assert (
            np.bincount(np.asarray(owner)[np.asarray(valid)], minlength=len(sizes)).tolist()
            == np.asarray(clamped).tolist()
        )


def test_token_tiles_regroup_the_rows_with_zeros_between_groups():
    x = jnp.arange(1, 301, dtype=jnp.float32)[:, None] * jnp.ones((1, 128))
    sizes = jnp.asarray([100, 0, 200], jnp.int32)
    rows = token_tiles.padded_rows(300, 3)
    values, scales = token_tiled(x, sizes, rows, E4M3)
    assert values.shape == (128, rows) and values.dtype == E4M3 and scales.shape == (rows // BLOCK, 128)
    values = (np.asarray(values, np.float32) * np.repeat(np.asarray(scales), BLOCK, axis=0).T)[0]
    for row, want in ((0, 1), (99, 100), (128, 101), (327, 300)):  # within e4m3's rounding
        assert abs(values[row] - want) <= want / 16, (row, values[row])
    assert not values[100:128].any() and not values[328:].any()


def test_bad_operands_are_refused_at_trace_time():
    a, b, sa, sb = _operands(jax.random.key(0), 256, 64, 96)
    gs = jnp.asarray([100, 100], jnp.int32)
    cases = [
        ((a[:, :200], b[:, :200], sa, sb, gs), ValueError, "rows must be a multiple of 128"),
        ((a, b, sa, sb, jnp.stack([gs] * 3)), ValueError, r"splits the 256 block-aligned rows into 3 blocks"),
        ((a, b, sa, sb, jnp.stack([gs] * 4)), ValueError, "each block.s rows must be a multiple of 128, got 64"),
        ((a, b[:, :128], sa, sb, gs), ValueError, "different row counts"),
        ((a.astype(jnp.bfloat16), b, sa, sb, gs), TypeError, "must hold fp8 values"),
        ((a, b.astype(jnp.float8_e5m2), sa, sb, gs), TypeError, r"b must hold fp8 values \(float8_e4m3fn\)"),
        ((a, b, sa.T, sb, gs), ValueError, r"scale_a must be float32 \[2, 64\]"),
        ((a, b, sa, sb[:1], gs), ValueError, r"scale_b must be float32 \[2, 96\]"),
        ((a, b, sa, sb, gs.astype(jnp.int16)), ValueError, "group_sizes must be int32"),
        ((a, b[None], sa, sb, gs), ValueError, r"b \[N', rows\]"),
    ]
    for operands, error, match in cases:
        with pytest.raises(error, match=match):
            jax.eval_shape(lambda *xs: scaled_ragged_k_dot(*xs), *operands)


def _weight_gradient_row() -> str | None:
    names = _ffi.compiled_variant_names()
    return next(
        (
            v.name
            for v in tables.load_menu()
            if v.dtype in tables.BLOCK_SCALED_DTYPES and v.problem == "ragged_k" and v.name in names
        ),
        None,
    )


def _plan(**kw):
    args = dict(problem="ragged_k", dtype=E4M3, out_dtype=jnp.bfloat16, a_major="k", b_major="k", device=H200)
    return plan_ragged(2048, 1408, 65536 + 64 * BLOCK, 64, **{**args, **kw})


@pytest.mark.skipif(_weight_gradient_row() is None, reason="the extension has no compiled block-scaled ragged_k row")
def test_the_weight_gradient_row_is_planned_and_explained(monkeypatch):
    row = _weight_gradient_row()
    pinned = _plan(variant=row)
    assert pinned.path == "kernel" and pinned.variant == row and pinned.schedule == "dynamic", pinned.reason
    menu = tuple(dataclasses.replace(v, validated=True) for v in tables.load_menu())
    monkeypatch.setattr(tables, "load_menu", lambda *args: menu)
    assert _plan().variant == row  # unpinned once a GPU has run it
    assert "K-major" in _plan(a_major="m", b_major="n").reason
    odd = plan_ragged(
        256, 256, 200, 4, problem="ragged_k", dtype=E4M3, out_dtype=jnp.bfloat16, a_major="k", b_major="k", device=H200
    )
    assert odd.path == "xla" and "not a multiple of the scale block" in odd.reason


def test_the_recipes_weight_gradient_is_each_groups_product_of_the_quantized_rows():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((384, 256)), jnp.bfloat16)
    dy = jnp.asarray(rng.standard_normal((384, 128)), jnp.bfloat16)
    sizes = jnp.asarray([100, 0, 28, 250], jnp.int32)  # the last group is cut at the rows
    dw = jax.jit(lambda x, dy: grouped_weight_gradient(x, dy, sizes, E4M3, jnp.float32))(x, dy)
    cut = np.asarray(clamp_group_sizes(sizes, 384))
    ends = np.cumsum(cut)
    x64, dy64 = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    ref = np.stack([x64[e - s : e].T @ dy64[e - s : e] for s, e in zip(cut, ends)])
    assert dw.shape == (4, 256, 128)
    assert not np.asarray(dw)[1].any()
    assert np.linalg.norm(np.asarray(dw) - ref) / np.linalg.norm(ref) < 5e-2  # e4m3 on both operands


def test_row_blocks_sum_their_products():
    """[S, G] sizes: ragged_k sums each block's product, each block on its own layout."""
    blocks = 2
    a, b, sa, sb = _operands(jax.random.key(3), blocks * 256, 64, 96)
    sizes = jnp.asarray([[100, 100], [0, 200]], jnp.int32)
    run = jax.jit(lambda *xs: scaled_ragged_k_dot(*xs, out_dtype=jnp.float32))
    out = np.asarray(run(a, b, sa, sb, sizes))
    parts = [
        run(
            a[:, s * 256 : (s + 1) * 256],
            b[:, s * 256 : (s + 1) * 256],
            sa[2 * s : 2 * s + 2],
            sb[2 * s : 2 * s + 2],
            sizes[s],
        )
        for s in range(blocks)
    ]
    np.testing.assert_allclose(out, sum(np.asarray(p) for p in parts), rtol=1e-6, atol=1e-6 * np.abs(out).max())
