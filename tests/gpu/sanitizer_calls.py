"""One small call of every compiled kernel variant and schedule of the present
GPU's architecture, for compute-sanitizer (test_gpu_sanitizer.py runs it
under memcheck and racecheck; scripts/gpu_check.sh's `sanitize` step too).

Each call is a problem of a few tiles with ragged edges, so the kernels'
boundary handling runs; the output is checked against a reference (XLA's
dot, or the host for grouped calls) so a silent wrong answer fails as well.
Prints one line per call and "calls: N, failures: F". Arguments, regexes,
limit the calls to the variants whose names match all of them; when none
does, it says so and exits with 2. `--token-tiles` makes instead one call of
the token-tile quantization kernel, checked bitwise against its XLA form,
and `--weight-blocks` one of the weight-block quantization kernel.
"""

import re
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jax_cluster import _ffi
from jax_cluster.planning import tables
from jax_cluster.planning.device import describe
from jax_cluster.primitives import mx_scales, token_tiles
from jax_cluster.primitives.epilogue import gemm_epilogue
from jax_cluster.primitives.gated import gated
from jax_cluster.primitives.gemm import gemm
from jax_cluster.primitives.lowering import xla_scaled_ragged
from jax_cluster.primitives.ragged import ragged
from jax_cluster.primitives.scaled_gemm import scaled_gemm
from jax_cluster.primitives.scaled_ragged import scaled_ragged_dot, scaled_ragged_k_dot
from jax_cluster.primitives.token_tile_quantize import quantize_token_tiles
from jax_cluster.primitives.weight_block_quantize import quantize_weight_blocks
from jax_cluster.tools.selftest import (
    DTYPES,
    dense_plan,
    grouped_plan,
    odd_shape,
    scaled_grouped_operands,
    scaled_operands,
)
from jax_cluster.tuning.accuracy import relative_error, tolerance


def _dense(v, schedule, key):
    m, n, k = odd_shape(v, v.cta_tile_m * v.cluster_m + 72, v.tile_n * v.cluster_n + 8, 328)
    plan = dense_plan(v, schedule, m, n, k)
    dt = DTYPES[v.dtype]
    dims = (((1 if v.a_major == "k" else 0,), (1 if v.b_major == "k" else 0,)), ((), ()))
    if v.epilogue == "bias_act":
        run = jax.jit(lambda a, b: gemm_epilogue(a, b, b_major=v.b_major, out_dtype=DTYPES[v.out], plan=plan))
    else:
        run = jax.jit(lambda a, b: gemm(a, b, a_major=v.a_major, b_major=v.b_major, out_dtype=DTYPES[v.out], plan=plan))
    worst = 0.0
    # twice, on other buffers: a kernel that keeps its launch parameters
    # (kernels/kept_params.h) launches the second call from the first's, moved
    for call_key in jax.random.split(key):
        ka, kb = jax.random.split(call_key)
        a = jax.random.normal(ka, (m, k) if v.a_major == "k" else (k, m), jnp.float32).astype(dt)
        b = jax.random.normal(kb, (n, k) if v.b_major == "k" else (k, n), jnp.float32).astype(dt)
        ref = jax.lax.dot_general(a.astype(jnp.float32), b.astype(jnp.float32), dims, precision="highest")
        worst = max(worst, float(relative_error(run(a, b), ref)))
    return worst


def _scaled(v, schedule, key):
    m, n, k = 132, v.tile_n + 8, 3 * tables.SCALE_BLOCK  # a ragged last row tile and column tile
    plan = dense_plan(v, schedule, m, n, k)
    mx = v.dtype == tables.MX_DTYPE
    operands = scaled_operands(key, m, n, k, DTYPES[v.dtype], mx)
    if mx:
        ref = _mx_reference(*(np.asarray(x) for x in operands))
    else:
        ref = _scaled_reference(*(np.asarray(x, np.float64) for x in operands))
    out = jax.jit(lambda *xs: scaled_gemm(*xs, out_dtype=DTYPES[v.out], plan=plan))(*operands)
    return float(relative_error(np.asarray(out.astype(jnp.float32)), ref))


def _scaled_reference(a, b, scale_a, scale_b):
    """The dequantized product on the host in float64 (no XLA kernel under the sanitizer)."""
    block = tables.SCALE_BLOCK
    a = a * np.repeat(scale_a.T, block, axis=1)
    b = b * np.repeat(np.repeat(scale_b.T, block, axis=0)[: b.shape[0]], block, axis=1)
    return a @ b.T


def _mx_reference(a, b, scale_a, scale_b):
    """The MX product on the host in float64, the scales read back from the
    kernel's layout (reshapes of host arrays: no XLA kernel)."""

    def dequantized(values, scales):
        rows, k = values.shape
        per_block = mx_scales.from_kernel_layout(scales, rows, k).astype(np.float64)
        return values.astype(np.float64) * np.repeat(per_block, tables.MX_SCALE_BLOCK, axis=1)[:, :k]

    return dequantized(a, scale_a) @ dequantized(b, scale_b).T


def _grouped(v, key):
    sizes = [0, 77, 1, 200, 0, 150]  # empty, one-row and tile-straddling groups, rows left over
    rows, kdim = sum(sizes) + 40, 136
    ndim = 272 if v.epilogue == "gated" else 264  # a ragged column tile; gated: whole gate/up pairs
    plan = grouped_plan(v, len(sizes), rows, kdim, ndim)
    ka, kb = jax.random.split(key)
    dt = DTYPES[v.dtype]
    a = jax.random.normal(ka, (rows, kdim), jnp.float32).astype(dt)
    if v.problem == "ragged_m":
        b_shape = (len(sizes), kdim, ndim) if v.b_major == "n" else (len(sizes), ndim, kdim)
    else:
        b_shape = (rows, ndim)
    b = jax.random.normal(kb, b_shape, jnp.float32).astype(dt)
    gs = jnp.asarray(sizes, jnp.int32)
    ref = _grouped_reference(np.asarray(a, np.float64), np.asarray(b, np.float64), sizes, v)
    if v.epilogue == "gated":
        run = jax.jit(lambda a, b, gs: gated(a, b, gs, b_major=v.b_major, activation="silu", plan=plan))
        pairs = ref.reshape(rows, -1, 2, tables.GATE_BLOCK)
        gate, up = pairs[:, :, 0], pairs[:, :, 1]
        ref = (gate / (1.0 + np.exp(-gate)) * up).reshape(rows, -1)
    else:
        run = jax.jit(lambda a, b, gs: ragged(a, b, gs, problem=v.problem, b_major=v.b_major, plan=plan))
    out = np.asarray(run(a, b, gs).astype(jnp.float32))
    return float(relative_error(out, ref))


def _grouped_reference(a, b, sizes, v):
    """The grouped product on the host in float64: no second GPU kernel (XLA's
    ragged dot) runs under the sanitizer, so whatever it reports is ours."""
    starts = np.cumsum([0, *sizes])
    if v.problem == "ragged_k":
        return np.stack([a[s:e].T @ b[s:e] for s, e in zip(starts[:-1], starts[1:])])
    out = np.zeros((a.shape[0], b.shape[2] if v.b_major == "n" else b.shape[1]))
    for g, (s, e) in enumerate(zip(starts[:-1], starts[1:])):
        out[s:e] = a[s:e] @ (b[g] if v.b_major == "n" else b[g].T)
    return out


def _scaled_grouped(v, key):
    if v.problem == "ragged_k":
        return _scaled_weight_gradient(v, key)
    sizes = [0, 77, 1, 200, 0, 150]  # as _grouped, with K in whole scale blocks
    rows, kdim, ndim = sum(sizes) + 40, 2 * tables.SCALE_BLOCK, 264
    plan = grouped_plan(v, len(sizes), rows, kdim, ndim)
    if v.dtype == tables.MX_DTYPE:  # e8m0 scales in the grouped layouts: the fallback is the reference
        gs = jnp.asarray(sizes, jnp.int32)
        operands = scaled_grouped_operands(key, rows, ndim, kdim, len(sizes), DTYPES[v.dtype], v.problem, gs)
        out = jax.jit(lambda *xs: scaled_ragged_dot(*xs, out_dtype=DTYPES[v.out], plan=plan))(*operands, gs)
        ref = xla_scaled_ragged(*operands, gs, out_dtype=jnp.float32, plan=plan)
        return float(relative_error(np.asarray(out.astype(jnp.float32)), np.asarray(ref, np.float64)))
    a, b, scale_a, scale_b = scaled_grouped_operands(key, rows, ndim, kdim, len(sizes), DTYPES[v.dtype])
    gs = jnp.asarray(sizes, jnp.int32)
    out = jax.jit(lambda *xs: scaled_ragged_dot(*xs, out_dtype=DTYPES[v.out], plan=plan))(a, b, scale_a, scale_b, gs)
    block = tables.SCALE_BLOCK
    a64 = np.asarray(a, np.float64) * np.repeat(np.asarray(scale_a, np.float64), block, axis=1)
    per_column = np.repeat(np.asarray(scale_b, np.float64), block, axis=2)[:, :, :ndim]
    b64 = np.asarray(b, np.float64) * np.repeat(per_column, block, axis=1).transpose(0, 2, 1)
    ref = _grouped_reference(a64, b64, sizes, v)  # b is [G, N, K]: v.b_major is "k"
    return float(relative_error(np.asarray(out.astype(jnp.float32)), ref))


def _scaled_weight_gradient(v, key):
    """The block-scaled ragged_k call: rows in the block-aligned layout, each
    group starting on a 128-row tile (primitives/token_tiles.py)."""
    sizes = [0, 77, 1, 200, 0, 150]
    block = tables.SCALE_BLOCK
    rows, kdim, ndim = token_tiles.padded_rows(sum(sizes) + 40, len(sizes)), 136, 264
    plan = grouped_plan(v, len(sizes), rows, kdim, ndim)
    a, b, scale_a, scale_b = scaled_grouped_operands(key, rows, ndim, kdim, len(sizes), DTYPES[v.dtype], v.problem)
    gs = jnp.asarray(sizes, jnp.int32)
    out = jax.jit(lambda *xs: scaled_ragged_k_dot(*xs, out_dtype=DTYPES[v.out], plan=plan))(a, b, scale_a, scale_b, gs)
    a64 = (np.asarray(a, np.float64) * np.repeat(np.asarray(scale_a, np.float64), block, axis=0).T).T
    b64 = (np.asarray(b, np.float64) * np.repeat(np.asarray(scale_b, np.float64), block, axis=0).T).T
    starts = np.cumsum([0, *(-(-s // block) * block for s in sizes)])
    ref = np.stack([a64[s : s + n].T @ b64[s : s + n] for s, n in zip(starts, sizes)])
    return float(relative_error(np.asarray(out.astype(jnp.float32)), ref))


def _token_tiles(key) -> int:
    """The token-tile quantization kernel on uneven groups, rows left over
    and a partial column block: 1 when it differs from its XLA form."""
    sizes = jnp.asarray([0, 77, 1, 200, 0, 150], jnp.int32)
    x = jax.random.normal(key, (470, 576), jnp.bfloat16)
    rows = token_tiles.padded_rows(470, 6)
    run = jax.jit(quantize_token_tiles, static_argnums=(2, 3), static_argnames="use_kernel")
    fused = run(x, sizes, rows, jnp.float8_e4m3fn, use_kernel=True)
    plain = run(x, sizes, rows, jnp.float8_e4m3fn, use_kernel=False)
    same = all(np.array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8)) for a, b in zip(fused, plain))
    print(f"token tiles: {'ok' if same else 'FAIL'}")
    print(f"calls: 1, failures: {int(not same)}")
    return 0 if same else 1


def _weight_blocks(key) -> int:
    """The weight-block quantization kernel on three groups of a block grid
    wider than tall, in both layouts: 1 when it differs from its XLA form."""
    w = jax.random.normal(key, (3, 256, 640), jnp.bfloat16)
    run = jax.jit(quantize_weight_blocks, static_argnums=1, static_argnames="use_kernel")
    fused = run(w, jnp.float8_e4m3fn, use_kernel=True)
    plain = run(w, jnp.float8_e4m3fn, use_kernel=False)
    same = all(np.array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8)) for a, b in zip(fused, plain))
    print(f"weight blocks: {'ok' if same else 'FAIL'}")
    print(f"calls: 1, failures: {int(not same)}")
    return 0 if same else 1


def main(argv) -> int:
    if argv == ["--token-tiles"]:
        return _token_tiles(jax.random.key(0))
    if argv == ["--weight-blocks"]:
        return _weight_blocks(jax.random.key(0))
    only = [re.compile(pattern) for pattern in argv]  # regexes on variant names: a name must match all
    dev = describe()
    if dev.arch is None or not _ffi.with_kernels():
        print(f"nothing to run: {_ffi.why_no_kernels() or dev.describe()}")
        return 2
    compiled = _ffi.compiled_variant_names()
    calls = failures = 0
    key = jax.random.key(0)
    for v in tables.load_menu():
        if v.arch != dev.arch or v.name not in compiled or not all(p.search(v.name) for p in only):
            continue
        for schedule in v.schedules if v.problem == "dense" else v.schedules[:1]:
            key, sub = jax.random.split(key)
            # the call's name first, so a crash inside it names the call
            print(f"{v.name} {schedule}: ", end="", flush=True)
            if v.problem != "dense" and v.dtype in tables.BLOCK_SCALED_DTYPES:
                err = _scaled_grouped(v, sub)
            elif v.problem != "dense":
                err = _grouped(v, sub)
            elif v.dtype in tables.BLOCK_SCALED_DTYPES:
                err = _scaled(v, schedule, sub)
            else:
                err = _dense(v, schedule, sub)
            ok = err <= tolerance(v.out, v.dtype)
            calls, failures = calls + 1, failures + (not ok)
            print(f"relative error {err:.2e} {'ok' if ok else 'FAIL'}", flush=True)
    print(f"calls: {calls}, failures: {failures}")
    if not calls:
        print(f"no compiled variant of {dev.arch} matches {[p.pattern for p in only]}")
        return 2
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
