"""The block-scaled fp8 grouped GEMM (ragged_m): its fallback against a
float64 product of the dequantized operands under the size rule, its
trace-time checks, the plans it gets (and that a row no GPU has run is taken
only when pinned) and ragged_dot's routing of QArrays through it."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_cluster
from jax_cluster import _ffi
from jax_cluster.planning import tables
from jax_cluster.planning.device import DeviceInfo
from jax_cluster.planning.grouped import plan_ragged
from jax_cluster.primitives.scaled_ragged import scaled_ragged_dot

E4M3 = jnp.float8_e4m3fn
H200 = DeviceInfo("cuda", "described H200", (9, 0), 132, 232448, 50 << 20)
BLOCK = tables.SCALE_BLOCK


def _operands(key, rows, n, k, groups):
    ka, kb, ksa, ksb = jax.random.split(key, 4)
    a = jax.random.normal(ka, (rows, k), jnp.float32).astype(E4M3)
    b = jax.random.normal(kb, (groups, n, k), jnp.float32).astype(E4M3)
    scale_a = jax.random.uniform(ksa, (rows, k // BLOCK), jnp.float32, 0.5, 2.0)
    scale_b = jax.random.uniform(ksb, (groups, k // BLOCK, -(-n // BLOCK)), jnp.float32, 0.5, 2.0)
    return a, b, scale_a, scale_b


def _reference(a, b, scale_a, scale_b, sizes):
    """Each group's rows times its dequantized weight in float64; a negative
    size counts as 0, groups are cut at the rows, rows past them are zero."""
    rows, n = a.shape[0], b.shape[1]
    a = np.asarray(a, np.float64) * np.repeat(np.asarray(scale_a, np.float64), BLOCK, axis=1)
    per_column = np.repeat(np.asarray(scale_b, np.float64), BLOCK, axis=2)[:, :, :n]
    b = np.asarray(b, np.float64) * np.repeat(per_column, BLOCK, axis=1).transpose(0, 2, 1)
    out, start = np.zeros((rows, n)), 0
    for g, size in enumerate(sizes):
        end = min(start + max(size, 0), rows)
        out[start:end] = a[start:end] @ b[g].T
        start = end
    return out


@pytest.mark.parametrize(
    "sizes",
    [[64, 0, 100, 92], [-5, 200, 0, 3], [10, 20, 30, 40], [300, 100, 0, 0]],
    ids=["uneven", "negative", "sum<rows", "sum>rows"],
)
def test_the_fallback_is_the_grouped_product_of_the_dequantized_operands(sizes):
    rows, n, k = 256, 200, 384
    a, b, sa, sb = _operands(jax.random.key(len(sizes) + sum(sizes)), rows, n, k, len(sizes))
    group_sizes = jnp.asarray(sizes, jnp.int32)
    out = jax.jit(lambda *xs: scaled_ragged_dot(*xs, out_dtype=jnp.float32))(a, b, sa, sb, group_sizes)
    ref = _reference(a, b, sa, sb, sizes)
    assert out.shape == (rows, n) and out.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-4 * np.abs(ref).max())
    bf16 = scaled_ragged_dot(a, b, sa, sb, group_sizes)  # eager, bfloat16 by default
    assert bf16.dtype == jnp.bfloat16
    assert np.linalg.norm(np.asarray(bf16, np.float64) - ref) / np.linalg.norm(ref) < 5e-3


def test_bad_operands_are_refused_at_trace_time():
    a, b, sa, sb = _operands(jax.random.key(0), 64, 256, 256, 3)
    sizes = jnp.asarray([20, 20, 24], jnp.int32)
    cases = [
        ((a[:, :200], b[:, :, :200], sa, sb, sizes), ValueError, "multiple of the scale block"),
        ((a, b[:, :, :128], sa, sb, sizes), ValueError, "contracting dimensions differ"),
        ((a.astype(jnp.bfloat16), b, sa, sb, sizes), TypeError, "must hold fp8 values"),
        ((a, b.astype(jnp.float8_e5m2), sa, sb, sizes), TypeError, r"b must hold fp8 values \(float8_e4m3fn\)"),
        ((a, b, sa.T, sb, sizes), ValueError, r"scale_a must be float32 \[64, 2\]"),
        ((a, b, sa, sb[:, :, :1], sizes), ValueError, r"scale_b must be float32 \[3, 2, 2\]"),
        ((a, b, sa, sb, sizes[:2]), ValueError, r"group_sizes must be int32 \[3\]"),
        ((a, b, sa, sb, sizes.astype(jnp.int16)), ValueError, "group_sizes must be int32"),
        ((a, b[0], sa, sb, sizes), ValueError, r"b \[G, N, K\]"),
    ]
    for operands, error, match in cases:
        with pytest.raises(error, match=match):
            jax.eval_shape(lambda *xs: scaled_ragged_dot(*xs), *operands)
    with pytest.raises(TypeError, match="output must be one of"):
        jax.eval_shape(lambda *xs: scaled_ragged_dot(*xs, out_dtype=jnp.float16), a, b, sa, sb, sizes)


def _grouped_scaled_row() -> str | None:
    """The block-scaled grouped GEMM row of sm_90a (not a decode row)."""
    names = _ffi.compiled_variant_names()
    return next(
        (
            v.name
            for v in tables.load_menu()
            if v.dtype in tables.BLOCK_SCALED_DTYPES
            and v.problem == "ragged_m"
            and v.kind != "decode"
            and v.name in names
        ),
        None,
    )


def _plan(m, n, k, groups, **kw):
    args = dict(problem="ragged_m", dtype=E4M3, out_dtype=jnp.bfloat16, a_major="k", b_major="k", device=H200)
    return plan_ragged(m, n, k, groups, **{**args, **kw})


@pytest.mark.skipif(_grouped_scaled_row() is None, reason="the extension has no compiled block-scaled grouped row")
def test_hopper_takes_the_grouped_row_unpinned():
    row = _grouped_scaled_row()
    plan = _plan(65536, 2048, 7168, 256)
    assert plan.path == "kernel" and plan.variant == row and plan.schedule == "dynamic"
    assert _plan(65536, 2048, 7168, 256, tile=(128, 128, 128)).variant == row


@pytest.mark.skipif(_grouped_scaled_row() is None, reason="the extension has no compiled block-scaled grouped row")
def test_a_row_no_gpu_has_run_is_taken_only_when_pinned(monkeypatch):
    row = _grouped_scaled_row()
    menu = tuple(dataclasses.replace(v, validated=v.validated and v.name != row) for v in tables.load_menu())
    monkeypatch.setattr(tables, "load_menu", lambda *args: menu)
    unpinned = _plan(65536, 2048, 7168, 256)
    assert unpinned.path == "xla" and "outside the ranking" in unpinned.reason
    pinned = _plan(65536, 2048, 7168, 256, variant=row)
    assert pinned.path == "kernel" and pinned.variant == row
    assert _plan(65536, 2048, 7168, 256, tile=(128, 128, 128)).variant == row


@pytest.mark.parametrize(
    "kw,why",
    [
        (dict(problem="ragged_k", a_major="m", b_major="n"), "K-major"),
        (dict(b_major="n"), "K-major"),
        (dict(k=200), "not a multiple of the scale block"),
        (dict(out_dtype=jnp.float16), "write bf16 or f32 from e4m3 inputs"),
    ],
)
def test_grouped_fp8_rules_send_other_calls_to_xla(kw, why):
    k = kw.pop("k", 256)
    p = plan_ragged(
        512,
        256,
        k,
        8,
        **{"problem": "ragged_m", "dtype": E4M3, "out_dtype": jnp.bfloat16, "a_major": "k", "b_major": "k", **kw},
        device=H200,
    )
    assert p.path == "xla" and why in p.reason, p.reason


@pytest.mark.skipif(_grouped_scaled_row() is None, reason="the extension has no compiled block-scaled grouped row")
@pytest.mark.parametrize("rhs_layout", ["gkn", "gnk"])
def test_ragged_dot_of_qarrays_under_a_pinned_plan_binds_the_scaled_op(rhs_layout):
    pytest.importorskip("qwix")
    rows, n, k, sizes = 256, 256, 256, [100, 0, -3, 120]
    kx, kw = jax.random.split(jax.random.key(5))
    x = jax.random.normal(kx, (rows, k), jnp.float32)
    w = jax.random.normal(kw, (len(sizes), k, n) if rhs_layout == "gkn" else (len(sizes), n, k), jnp.float32)
    qx, qw = jax_cluster.quantize(x), jax_cluster.quantize(w, block=(128, 128))
    group_sizes = jnp.asarray(sizes, jnp.int32)
    plan = _plan(rows, n, k, len(sizes), variant=_grouped_scaled_row())

    def run(qx, qw, group_sizes):
        return jax_cluster.ragged_dot(qx, qw, group_sizes, rhs_layout=rhs_layout, plan=plan)

    assert "jax_cluster_scaled_ragged_dot" in str(jax.make_jaxpr(run)(qx, qw, group_sizes))
    out = jax.jit(run)(qx, qw, group_sizes)  # the CPU runs the op's float32 fallback
    dx, dw = jax_cluster.dequantize(qx), jax_cluster.dequantize(qw)
    dw = dw if rhs_layout == "gkn" else dw.transpose(0, 2, 1)
    ref, start = np.zeros((rows, n)), 0
    for g, size in enumerate(sizes):
        end = min(start + max(size, 0), rows)
        ref[start:end] = np.asarray(dx, np.float64)[start:end] @ np.asarray(dw, np.float64)[g]
        start = end
    assert out.dtype == jnp.bfloat16
    assert np.linalg.norm(np.asarray(out, np.float64) - ref) / np.linalg.norm(ref) < 5e-3
    unpinned = jax.make_jaxpr(lambda *xs: jax_cluster.ragged_dot(*xs, rhs_layout=rhs_layout))(qx, qw, group_sizes)
    assert "jax_cluster_scaled_ragged_dot" not in str(unpinned)  # a CPU host: dequantized bf16


@pytest.mark.skipif(_grouped_scaled_row() is None, reason="the extension has no compiled block-scaled grouped row")
@pytest.mark.parametrize("offset", [0, 2, 5])
def test_ragged_dot_of_qarrays_with_group_offset_binds_the_scaled_op(offset):
    """Expert parallelism in fp8: rhs holds G_local groups from the offset on;
    rows of every other group are zero."""
    pytest.importorskip("qwix")
    rows, n, k, sizes, local = 384, 256, 256, [40, 0, 77, 100, 13, 90], 3
    kx, kw = jax.random.split(jax.random.key(9))
    qx = jax_cluster.quantize(jax.random.normal(kx, (rows, k), jnp.float32))
    qw = jax_cluster.quantize(jax.random.normal(kw, (local, k, n), jnp.float32), block=(128, 128))
    group_sizes = jnp.asarray(sizes, jnp.int32)
    plan = _plan(rows, n, k, local, variant=_grouped_scaled_row())

    def run(qx, qw, group_sizes):
        return jax_cluster.ragged_dot(qx, qw, group_sizes, group_offset=offset, plan=plan)

    assert "jax_cluster_scaled_ragged_dot" in str(jax.make_jaxpr(run)(qx, qw, group_sizes))
    out = np.asarray(jax.jit(run)(qx, qw, group_sizes), np.float64)
    dx, dw = np.asarray(jax_cluster.dequantize(qx), np.float64), np.asarray(jax_cluster.dequantize(qw), np.float64)
    ref, start = np.zeros((rows, n)), 0
    for g, size in enumerate(sizes):
        end = min(start + size, rows)
        if offset <= g < offset + local:
            ref[start:end] = dx[start:end] @ dw[g - offset]
        start = end
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 5e-3
    assert not out[(ref == 0).all(axis=1)].any()  # other shards' rows are exact zeros


def test_ragged_dot_of_qarrays_of_the_wrong_rank_names_the_shapes():
    pytest.importorskip("qwix")
    qx = jax_cluster.quantize(jnp.ones((2, 128, 256), jnp.float32))
    qw = jax_cluster.quantize(jnp.ones((2, 256, 128), jnp.float32), block=(128, 128))
    with pytest.raises(ValueError, match=r"lhs must be \[M,K\]"):
        jax_cluster.ragged_dot(qx, qw, jnp.asarray([64, 64], jnp.int32))


def test_row_blocks_are_each_their_own_call():
    """[S, G] sizes: ragged_m writes each block's rows as its own call would."""
    blocks, rows, n, k, groups = 3, 128, 256, 256, 4
    a, b, scale_a, scale_b = _operands(jax.random.key(21), blocks * rows, n, k, groups)
    sizes = jnp.asarray([[40, 0, 60, 28], [128, 0, 0, 0], [-5, 90, 30, 50]], jnp.int32)
    run = jax.jit(lambda *xs: scaled_ragged_dot(*xs, out_dtype=jnp.float32))
    out = np.asarray(run(a, b, scale_a, scale_b, sizes))
    for s in range(blocks):
        part = slice(s * rows, (s + 1) * rows)
        np.testing.assert_array_equal(out[part], np.asarray(run(a[part], b, scale_a[part], scale_b, sizes[s])))
    with pytest.raises(ValueError, match="splits the 384 rows into 5 blocks"):
        scaled_ragged_dot(a, b, scale_a, scale_b, jnp.zeros((5, groups), jnp.int32))
    with pytest.raises(ValueError, match=r"int32 \[4\] or \[S, 4\]"):
        scaled_ragged_dot(a, b, scale_a, scale_b, jnp.zeros((3, 5), jnp.int32))


def test_vmap_runs_the_block_scaled_ops_per_element():
    a, b, scale_a, scale_b = _operands(jax.random.key(22), 128, 128, 256, 2)
    sizes = jnp.asarray([[50, 78], [128, 0]], jnp.int32)
    stack = lambda x: jnp.stack([x, x[::-1]])  # noqa: E731
    run = jax.vmap(lambda a, s: scaled_ragged_dot(a, b, s, scale_b, sizes[0], out_dtype=jnp.float32))
    out = run(stack(a), stack(scale_a))
    for i in range(2):
        want = scaled_ragged_dot(stack(a)[i], b, stack(scale_a)[i], scale_b, sizes[0], out_dtype=jnp.float32)
        np.testing.assert_array_equal(np.asarray(out[i]), np.asarray(want))
