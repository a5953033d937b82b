"""The block-scaled fp8 kernels on a Hopper GPU, through the planner's plans: matmul
of quantized operands, ragged_dot of them, the weight gradient's ragged_k
product and the in-place [N, K] product against the float32
product of their dequantized values (tight) and against the bf16 product of
the unquantized inputs (the quantization's own error, stated), with
NaN-poisoned outputs (conftest) and bitwise-repeatable results."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import fresh_key

import jax_cluster
from jax_cluster.ops.fp8_dense import scaled_product
from jax_cluster.ops.fp8_grouped import grouped_weight_gradient
from jax_cluster.planning import tables
from jax_cluster.primitives import token_tiles
from jax_cluster.primitives.scaled_ragged import scaled_ragged_k_dot

pytestmark = pytest.mark.gpu
E4M3 = jnp.float8_e4m3fn


def _rel(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return np.linalg.norm(out - ref) / np.linalg.norm(ref)


def _kernel_plan(m, n, k):
    p = jax_cluster.plan(m, n, k, dtype=E4M3, out_dtype=jnp.bfloat16, b_major="k")
    if p.path != "kernel":
        pytest.skip(f"no block-scaled kernel here: {p.reason}")
    return p


@pytest.mark.parametrize("m,n,k", [(4, 128, 128), (132, 256, 256), (1000, 1024, 4096), (4096, 4096, 4096)])
def test_quantized_matmul_runs_the_kernel_and_matches_its_dequantized_values(m, n, k):
    plan = _kernel_plan(m, n, k)
    ka, kb = jax.random.split(fresh_key())
    x = jax.random.normal(ka, (m, k), jnp.float32)
    w = jax.random.normal(kb, (k, n), jnp.float32)
    qx, qw = jax_cluster.quantize(x), jax_cluster.quantize(w, block=(128, 128))
    run = jax.jit(lambda qx, qw: jax_cluster.matmul(qx, qw, plan=plan))
    text = run.lower(qx, qw).as_text()
    assert tables.FFI_TARGETS["scaled_gemm"] in text, "the quantized matmul did not reach the kernel"
    out = run(qx, qw)
    assert out.dtype == jnp.bfloat16 and bool(jnp.isfinite(out).all())
    ref = np.asarray(jax_cluster.dequantize(qx), np.float64) @ np.asarray(jax_cluster.dequantize(qw), np.float64)
    assert _rel(out, ref) < 5e-3  # bf16 rounding of the output
    assert np.array_equal(np.asarray(run(qx, qw)), np.asarray(out))  # repeatable bit for bit
    # against the unquantized inputs' bf16 product: the fp8 rounding itself
    bf16 = jnp.matmul(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), preferred_element_type=jnp.float32)
    assert _rel(out, bf16) < 8e-2
    assert plan.dtype == "e4m3"


def test_an_n_by_k_weight_is_read_in_place():
    plan = _kernel_plan(256, 384, 512)
    ka, kb = jax.random.split(fresh_key())
    x = jax.random.normal(ka, (256, 512), jnp.float32)
    w = jax.random.normal(kb, (384, 512), jnp.float32)  # [N, K]
    qx, qw = jax_cluster.quantize(x), jax_cluster.quantize(w, block=(128, 128))
    out = jax.jit(lambda a, b: scaled_product(a, b, 1, jnp.bfloat16, plan))(qx, qw)
    ref = np.asarray(jax_cluster.dequantize(qx), np.float64) @ np.asarray(jax_cluster.dequantize(qw), np.float64).T
    assert _rel(out, ref) < 5e-3


def test_rows_the_kernel_cannot_take_fall_back_with_the_same_values():
    x = jax.random.normal(fresh_key(), (6, 256), jnp.float32)  # M = 6: not a multiple of 4
    w = jax.random.normal(fresh_key(), (256, 128), jnp.float32)
    qx, qw = jax_cluster.quantize(x), jax_cluster.quantize(w, block=(128, 128))
    pinned = dict(dtype=E4M3, out_dtype=jnp.bfloat16, b_major="k", tile=(128, 128, 128))
    assert jax_cluster.plan(6, 128, 256, **pinned).path == "xla"
    out = jax.jit(jax_cluster.matmul)(qx, qw)
    ref = np.asarray(jax_cluster.dequantize(qx), np.float64) @ np.asarray(jax_cluster.dequantize(qw), np.float64)
    assert _rel(out, ref) < 1e-2


def _scaled_row(problem: str) -> str:
    names = jax_cluster.info().compiled_variants
    row = next(
        (v.name for v in tables.load_menu() if v.dtype == "e4m3" and v.problem == problem and v.name in names),
        None,
    )
    if row is None:
        pytest.skip(f"no block-scaled {problem} row is compiled for this GPU")
    return row


def _grouped_row() -> str:
    return _scaled_row("ragged_m")


@pytest.mark.parametrize("rhs_layout", ["gkn", "gnk"])
@pytest.mark.parametrize("sizes", [[300, 0, 1, 211], [-4, 640, 0, 5, 77], [128] * 9], ids=str)
def test_quantized_ragged_dot_on_the_grouped_kernel(sizes, rhs_layout):
    """Pinned to the row: uneven, empty, negative and tile-sized groups, rows
    past the groups exact zeros."""
    rows, k, n = 768, 512, 384
    ka, kb = jax.random.split(fresh_key())
    x = jax.random.normal(ka, (rows, k), jnp.float32)
    shape = (len(sizes), k, n) if rhs_layout == "gkn" else (len(sizes), n, k)
    w = jax.random.normal(kb, shape, jnp.float32)
    qx, qw = jax_cluster.quantize(x), jax_cluster.quantize(w, block=(128, 128))
    gs = jnp.asarray(sizes, jnp.int32)
    plan = jax_cluster.plan_ragged(
        rows,
        n,
        k,
        len(sizes),
        problem="ragged_m",
        dtype=E4M3,
        out_dtype=jnp.bfloat16,
        a_major="k",
        b_major="k",
        variant=_grouped_row(),
    )
    run = jax.jit(lambda qx, qw, gs: jax_cluster.ragged_dot(qx, qw, gs, rhs_layout=rhs_layout, plan=plan))
    assert tables.FFI_TARGETS["scaled_ragged_dot"] in run.lower(qx, qw, gs).as_text()
    out = np.asarray(run(qx, qw, gs), np.float64)
    dx, dw = np.asarray(jax_cluster.dequantize(qx), np.float64), np.asarray(jax_cluster.dequantize(qw), np.float64)
    dw = dw if rhs_layout == "gkn" else dw.transpose(0, 2, 1)
    ref, start = np.zeros((rows, n)), 0
    for g, size in enumerate(sizes):
        end = min(start + max(size, 0), rows)
        ref[start:end] = dx[start:end] @ dw[g]
        start = end
    assert _rel(out, ref) < 5e-3
    assert (out[start:] == 0).all()  # rows past the groups
    assert np.array_equal(np.asarray(run(qx, qw, gs), np.float64), out)  # repeatable bit for bit


def test_the_planner_takes_the_grouped_kernel_for_quantized_ragged_dot():
    """No plan given: a QArray ragged_dot of a kernel-sized call runs the
    block-scaled grouped kernel, not the dequantized bf16 path."""
    rows, k, n, sizes = 1024, 768, 512, [256, 0, 300, 468]
    ka, kb = jax.random.split(fresh_key())
    qx = jax_cluster.quantize(jax.random.normal(ka, (rows, k), jnp.float32))
    qw = jax_cluster.quantize(jax.random.normal(kb, (len(sizes), k, n), jnp.float32), block=(128, 128))
    gs = jnp.asarray(sizes, jnp.int32)
    run = jax.jit(jax_cluster.ragged_dot)
    assert tables.FFI_TARGETS["scaled_ragged_dot"] in run.lower(qx, qw, gs).as_text()
    out = np.asarray(run(qx, qw, gs), np.float64)
    dx, dw = np.asarray(jax_cluster.dequantize(qx), np.float64), np.asarray(jax_cluster.dequantize(qw), np.float64)
    ref = np.concatenate(
        [dx[a:b] @ dw[g] for g, (a, b) in enumerate(zip(np.cumsum([0, *sizes[:-1]]), np.cumsum(sizes)))]
    )
    assert _rel(out, ref) < 5e-3


@pytest.mark.parametrize("offset", [0, 3])
def test_quantized_ragged_dot_with_group_offset_on_the_grouped_kernel(offset):
    """Expert parallelism in fp8: the local groups on the kernel, every other
    group's rows exact zeros."""
    rows, k, n, sizes, local = 1024, 512, 384, [200, 0, 130, 260, 90, 344], 2
    ka, kb = jax.random.split(fresh_key())
    qx = jax_cluster.quantize(jax.random.normal(ka, (rows, k), jnp.float32))
    qw = jax_cluster.quantize(jax.random.normal(kb, (local, k, n), jnp.float32), block=(128, 128))
    gs = jnp.asarray(sizes, jnp.int32)
    run = jax.jit(lambda qx, qw, gs: jax_cluster.ragged_dot(qx, qw, gs, group_offset=offset))
    assert tables.FFI_TARGETS["scaled_ragged_dot"] in run.lower(qx, qw, gs).as_text()
    out = np.asarray(run(qx, qw, gs), np.float64)
    dx, dw = np.asarray(jax_cluster.dequantize(qx), np.float64), np.asarray(jax_cluster.dequantize(qw), np.float64)
    ref, start = np.zeros((rows, n)), 0
    for g, size in enumerate(sizes):
        if offset <= g < offset + local:
            ref[start : start + size] = dx[start : start + size] @ dw[g - offset]
        start += size
    assert _rel(out, ref) < 5e-3
    assert not out[(ref == 0).all(axis=1)].any()


@pytest.mark.parametrize("m,n,k", [(6, 256, 128), (300, 520, 1024), (4096, 4096, 4096)])
def test_mx_matmul_runs_the_mx_kernel_and_matches_its_dequantized_values(m, n, k):
    """MXFP8 on a Blackwell GPU (skips elsewhere): (1, 32) activations times a
    [K, N] weight in (32, 1) blocks, any M, scales reordered for the kernel."""
    plan = jax_cluster.plan(m, n, k, dtype=tables.MX_DTYPE, out_dtype=jnp.bfloat16, b_major="k")
    if plan.path != "kernel":
        pytest.skip(f"no MX kernel here: {plan.reason}")
    ka, kb = jax.random.split(fresh_key())
    qx = jax_cluster.quantize(jax.random.normal(ka, (m, k), jnp.float32), block=(1, 32))
    qw = jax_cluster.quantize(jax.random.normal(kb, (k, n), jnp.float32), block=(32, 1))
    run = jax.jit(lambda qx, qw: jax_cluster.matmul(qx, qw))
    assert tables.FFI_TARGETS["scaled_gemm"] in run.lower(qx, qw).as_text()
    out = run(qx, qw)
    ref = np.asarray(jax_cluster.dequantize(qx), np.float64) @ np.asarray(jax_cluster.dequantize(qw), np.float64)
    assert _rel(out, ref) < 5e-3
    assert np.array_equal(np.asarray(run(qx, qw)), np.asarray(out))  # repeatable bit for bit


def _weight_gradient_row() -> str:
    return _scaled_row("ragged_k")


@pytest.mark.parametrize("sizes", [[300, 0, 1, 211], [-4, 640, 0, 5, 77], [128] * 9, [2000, 3]], ids=str)
def test_the_weight_gradient_kernel_matches_its_dequantized_values(sizes):
    """Pinned to the ragged_k row: uneven, empty, negative, tile-sized and
    cut groups in the block-aligned layout; empty groups exact zeros."""
    m, n, groups = 384, 264, len(sizes)
    rows = token_tiles.padded_rows(768, groups)
    keys = jax.random.split(fresh_key(), 4)
    a = jax.random.normal(keys[0], (m, rows), jnp.float32).astype(E4M3)
    b = jax.random.normal(keys[1], (n, rows), jnp.float32).astype(E4M3)
    sa = jax.random.uniform(keys[2], (rows // 128, m), jnp.float32, 0.5, 2.0)
    sb = jax.random.uniform(keys[3], (rows // 128, n), jnp.float32, 0.5, 2.0)
    gs = jnp.asarray(sizes, jnp.int32)
    plan = jax_cluster.plan_ragged(
        m, n, rows, groups, problem="ragged_k", dtype=E4M3, out_dtype=jnp.bfloat16, a_major="k", b_major="k",
        variant=_weight_gradient_row(),
    )  # fmt: skip
    run = jax.jit(lambda *xs: scaled_ragged_k_dot(*xs, plan=plan))
    assert tables.FFI_TARGETS["scaled_ragged_dot"] in run.lower(a, b, sa, sb, gs).as_text()
    out = np.asarray(run(a, b, sa, sb, gs), np.float64)
    a64 = np.asarray(a, np.float64) * np.repeat(np.asarray(sa, np.float64), 128, axis=0).T
    b64 = np.asarray(b, np.float64) * np.repeat(np.asarray(sb, np.float64), 128, axis=0).T
    start, ref = 0, np.zeros((groups, m, n))
    for g, size in enumerate(max(s, 0) for s in sizes):
        end = min(start + size, rows)
        ref[g] = a64[:, start:end] @ b64[:, start:end].T
        start = min(start + -(-size // 128) * 128, rows)
    assert _rel(out, ref) < 5e-3
    assert not out[[g for g, s in enumerate(sizes) if s <= 0]].any()
    assert np.array_equal(np.asarray(run(a, b, sa, sb, gs), np.float64), out)  # repeatable bit for bit


def test_the_recipes_grouped_weight_gradient_runs_the_kernel(monkeypatch):
    """With the ragged_k row taken unpinned, fp8_grouped's weight gradient
    runs on it and matches the float64 product of the same fp8 values."""
    row = _weight_gradient_row()
    menu = tuple(dataclasses.replace(v, validated=True) for v in tables.load_menu())
    monkeypatch.setattr(tables, "load_menu", lambda *args: menu)
    rows, k, n, sizes = 1024, 512, 384, jnp.asarray([300, 0, 212, 500], jnp.int32)
    kx, kd = jax.random.split(fresh_key())
    x = jax.random.normal(kx, (rows, k), jnp.bfloat16)
    dy = jax.random.normal(kd, (rows, n), jnp.bfloat16)
    run = jax.jit(lambda x, dy: grouped_weight_gradient(x, dy, sizes, E4M3, jnp.bfloat16))
    text = run.lower(x, dy).as_text()
    assert tables.FFI_TARGETS["scaled_ragged_dot"] in text and row
    out = np.asarray(run(x, dy), np.float64)
    ends = np.cumsum(np.asarray(sizes))
    x64, dy64 = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    ref = np.stack([x64[e - s : e].T @ dy64[e - s : e] for s, e in zip(np.asarray(sizes), ends)])
    assert not out[1].any()
    assert _rel(out, ref) < 5e-2  # e4m3 on both operands: the recipe's own error


def test_the_grouped_recipe_takes_token_blocks_on_the_kernels():
    """[S, G] sizes (MoEMLP's token_blocks): the recipe's three products run
    the block-scaled kernels, each row block as its own call would."""
    from jax_cluster.ops.fp8_training import fp8_grouped

    blocks, rows, groups = 2, 1024, 8
    kx, kw = jax.random.split(fresh_key())
    x = jax.random.normal(kx, (blocks * rows, 1024), jnp.bfloat16)
    w = (jax.random.normal(kw, (groups, 1024, 1536), jnp.float32) * 0.05).astype(jnp.bfloat16)
    cuts = np.sort(np.random.default_rng(0).integers(0, rows + 1, (blocks, groups)), axis=1)
    sizes = jnp.asarray(np.diff(cuts, axis=1, prepend=0), jnp.int32)
    grads = jax.jit(jax.grad(lambda x, w, s: jnp.sum(fp8_grouped(x, w, s).astype(jnp.float32) ** 2), (0, 1)))
    text = grads.lower(x, w, sizes).as_text()
    if tables.FFI_TARGETS["scaled_ragged_dot"] not in text:
        pytest.skip("no block-scaled grouped kernel here")
    dx, dw = grads(x, w, sizes)
    parts = [grads(x[b * rows : (b + 1) * rows], w, sizes[b]) for b in range(blocks)]
    assert np.array_equal(np.asarray(dx, np.float32), np.concatenate([np.asarray(p[0], np.float32) for p in parts]))
    assert _rel(dw, sum(np.asarray(p[1], np.float32) for p in parts)) < 5e-3  # summed in float32, rounded once


def test_the_grouped_recipe_with_group_offset_on_the_kernels():
    """Expert parallelism in fp8 on the kernels: a shard's experts give the
    products of their own rows, every other row zero, forward and input
    gradient alike."""
    from jax_cluster.ops.fp8_training import fp8_grouped

    sizes, offset, local = jnp.asarray([300, 212, 512, 256, 500, 268], jnp.int32), 2, 2
    first, last = 512, 1280
    kx, kw = jax.random.split(fresh_key())
    x = jax.random.normal(kx, (2048, 1024), jnp.bfloat16)
    w = (jax.random.normal(kw, (local, 1024, 1536), jnp.float32) * 0.05).astype(jnp.bfloat16)
    loss = lambda x, w, s, o: jnp.sum(fp8_grouped(x, w, s, "blockwise", E4M3, o).astype(jnp.float32) ** 2)  # noqa: E731
    grads = jax.jit(jax.grad(loss, (0, 1)), static_argnums=3)
    if tables.FFI_TARGETS["scaled_ragged_dot"] not in grads.lower(x, w, sizes, offset).as_text():
        pytest.skip("no block-scaled grouped kernel here")
    dx, dw = grads(x, w, sizes, offset)
    mine = sizes[offset : offset + local]
    dx_alone, dw_alone = grads(x[first:last], w, mine, None)
    d = np.asarray(dx, np.float32)
    assert not d[:first].any() and not d[last:].any()
    assert _rel(d[first:last], dx_alone) < 1e-2  # the same fp8 products (a plan for other rows may tile them otherwise)
    assert _rel(dw, dw_alone) < 4e-2  # the same rows on other token tiles: other scales
