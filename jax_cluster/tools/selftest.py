"""Runs every compiled variant for the present GPU against XLA.

    python -m jax_cluster.selftest [--quick] [--only REGEX] [--jobs N]

For each variant and each schedule it can run: tile counts one below, equal
to and one above the resident clusters (cudaOccupancyMaxActiveClusters), and
odd but TMA-aligned M/N/K; grouped (ragged_dot) variants get the same tile
counts spread over groups, plus uneven groups with empty and one-row groups
and rows left over. Prints a pass/fail table with the relative errors
against a float32 reference and exits non-zero on any failure; exits 2 when
there is nothing to test (no GPU of a compiled architecture).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import sys

import jax
import jax.numpy as jnp
from jax import lax

from jax_cluster import _ffi
from jax_cluster.planning import tables
from jax_cluster.planning.dense import plan_gemm
from jax_cluster.planning.device import describe
from jax_cluster.planning.grouped import plan_ragged
from jax_cluster.planning.tables import ACTIVATIONS
from jax_cluster.primitives import mx_scales, token_tiles
from jax_cluster.primitives.activations import apply_epilogue
from jax_cluster.primitives.epilogue import gemm_epilogue
from jax_cluster.primitives.gated import gated
from jax_cluster.primitives.gemm import gemm
from jax_cluster.primitives.lowering import clamp_group_sizes, gate_product, xla_scaled_gemm, xla_scaled_ragged
from jax_cluster.primitives.ragged import ragged
from jax_cluster.primitives.scaled_gemm import scaled_gemm
from jax_cluster.primitives.scaled_ragged import scaled_ragged_dot, scaled_ragged_k_dot
from jax_cluster.tuning import accuracy
from jax_cluster.tuning.accuracy import tolerance

# (M, N, K) with M odd, for A stored [M,K]; odd_shape() moves the odd size to
# K when A is stored [K,M], since TMA needs 16-byte leading dimensions.
ODD_SHAPES = [(7, 24, 8), (129, 136, 72), (333, 2056, 1000), (1000, 1016, 4104)]
# Block-scaled rows need K in whole 128-blocks and M a multiple of 4; N stays odd-sized.
SCALED_ODD_SHAPES = [(4, 24, 128), (132, 136, 256), (332, 2056, 1024), (1000, 1016, 4096)]
DTYPES = {name: jnp.dtype(numpy_name) for name, numpy_name in tables.NUMPY_DTYPES.items()}


def _boundary_shapes(v: tables.Variant, clusters: int, k: int = 512):
    """Problems whose cluster tiles number clusters - 1, clusters and clusters + 1."""
    rows = v.cta_tile_m * v.cluster_m
    cols = v.tile_n * v.cluster_n
    return [
        (f"{count} tiles / {clusters} clusters", rows, cols * count, k)
        for count in (max(1, clusters - 1), clusters, clusters + 1)
    ]


def odd_shape(v: tables.Variant, m: int, n: int, k: int) -> tuple[int, int, int]:
    """An odd but TMA-aligned problem for the variant's layouts."""
    return (k, n, m) if v.a_major == "m" else (m, n, k)


def dense_cases(v: tables.Variant, clusters: int, quick: bool):
    """(label, M, N, K): the boundary tile counts, then odd sizes unless quick."""
    cases = _boundary_shapes(v, clusters)
    if not quick:
        scaled = v.dtype in tables.BLOCK_SCALED_DTYPES
        odd = [odd_shape(v, *shape) for shape in (SCALED_ODD_SHAPES if scaled else ODD_SHAPES)]
        cases += [(f"{m}x{n}x{k}", m, n, k) for m, n, k in odd]
    return cases


def dense_plan(v: tables.Variant, schedule: str, m: int, n: int, k: int, device=None):
    extra = {"splits": 2} if schedule == "split_k" else {}
    plan = plan_gemm(
        m,
        n,
        k,
        dtype=v.dtype,  # the contract's name: mxe4m3 and e4m3 share numpy's dtype
        out_dtype=v.out,
        a_major=v.a_major,
        b_major=v.b_major,
        device=device,
        epilogue=v.epilogue,
        variant=v.name,
        schedule=schedule,
        **extra,
    )
    if plan.variant != v.name:
        raise RuntimeError(f"planner did not take {v.name}: {plan.reason}")
    return plan


def _check_dense(v: tables.Variant, plans, key) -> list[tuple[float, float]]:
    """Errors of every plan of one variant against XLA in float32, from one
    executable (one compile per variant keeps the self-test short). Fused
    epilogue rows also get a bias, a C and each activation in turn."""
    dt, out_dt = DTYPES[v.dtype], DTYPES[v.out]
    activations = list(ACTIVATIONS)

    @jax.jit
    def errors(key):
        found = []
        for i, (plan, sub) in enumerate(zip(plans, jax.random.split(key, len(plans)))):
            ka, kb, kc = jax.random.split(sub, 3)
            m, n, k = plan.m, plan.n, plan.k
            a = jax.random.normal(ka, (m, k) if v.a_major == "k" else (k, m), jnp.float32)
            b = jax.random.normal(kb, (n, k) if v.b_major == "k" else (k, n), jnp.float32)
            # the barrier keeps XLA from folding the rounding to dt out of the reference
            a, b = lax.optimization_barrier((a.astype(dt), b.astype(dt)))
            dims = (((1 if v.a_major == "k" else 0,), (1 if v.b_major == "k" else 0,)), ((), ()))
            ref = lax.dot_general(a.astype(jnp.float32), b.astype(jnp.float32), dims, precision=lax.Precision.HIGHEST)
            if v.epilogue == "bias_act":
                act = activations[i % len(activations)]
                bias, c = lax.optimization_barrier(
                    tuple(
                        jax.random.normal(kk, shape, jnp.float32).astype(out_dt)
                        for kk, shape in zip(jax.random.split(kc), ((n,), (m, n)))
                    )
                )
                out = gemm_epilogue(
                    a, b, bias, c, b_major=v.b_major, out_dtype=out_dt, alpha=0.5, beta=1.0, activation=act, plan=plan
                )
                ref = apply_epilogue(ref, bias, c, alpha=0.5, beta=1.0, activation=act, out_dtype=jnp.float32)
            else:
                out = gemm(a, b, a_major=v.a_major, b_major=v.b_major, out_dtype=out_dt, plan=plan)
            found.append(accuracy.errors(out, ref))
        return found

    return [(float(r), float(w)) for r, w in jax.device_get(errors(key))]


def mx_codes(key, rows: int, k: int):
    """Random e8m0 scales [rows, K/32]: bytes 125..129, 2^-2 .. 2^2."""
    codes = jax.random.randint(key, (rows, -(-k // tables.MX_SCALE_BLOCK)), 125, 130).astype(jnp.uint8)
    return codes.view(mx_scales.SCALE_DTYPE)


def scaled_operands(key, m: int, n: int, k: int, dtype, mx: bool = False):
    """Random fp8 A [M,K], B [N,K] and block scales in the kernel's layouts:
    float32 in [0.5, 2), K blocks first; or (mx) e8m0 powers of two from 1/4
    to 4, one per 32 values along K, in the MX kernel's layout."""
    ka, kb, ksa, ksb = jax.random.split(key, 4)
    a = jax.random.normal(ka, (m, k), jnp.float32).astype(dtype)
    b = jax.random.normal(kb, (n, k), jnp.float32).astype(dtype)
    if mx:

        def scales(key, rows):
            return mx_scales.to_kernel_layout(mx_codes(key, rows, k), k)

        return a, b, scales(ksa, m), scales(ksb, n)
    blocks = k // tables.SCALE_BLOCK
    scale_a = jax.random.uniform(ksa, (blocks, m), jnp.float32, 0.5, 2.0)
    scale_b = jax.random.uniform(ksb, (blocks, -(-n // tables.SCALE_BLOCK)), jnp.float32, 0.5, 2.0)
    return a, b, scale_a, scale_b


def _check_scaled(v: tables.Variant, plans, key) -> list[tuple[float, float]]:
    """Errors of every plan of a block-scaled variant against the float32
    product of its dequantized operands, from one executable."""

    @jax.jit
    def errors(key):
        found = []
        for plan, sub in zip(plans, jax.random.split(key, len(plans))):
            operands = scaled_operands(sub, plan.m, plan.n, plan.k, DTYPES[v.dtype], v.dtype == tables.MX_DTYPE)
            operands = lax.optimization_barrier(operands)
            ref = xla_scaled_gemm(*operands, out_dtype=jnp.float32, plan=plan)
            out = scaled_gemm(*operands, out_dtype=DTYPES[v.out], plan=plan)
            found.append(accuracy.errors(out, ref))
        return found

    return [(float(r), float(w)) for r, w in jax.device_get(errors(key))]


def grouped_cases(v: tables.Variant, clusters: int, quick: bool):
    """(label, groups sizes, rows, K' or K, N): tile counts around the resident
    CTAs with one tile per group, then uneven groups (empty, one-row, rest unused).
    A block-scaled ragged_k variant takes its rows in the block-aligned layout."""
    per_tile = v.tile_m if v.problem == "ragged_m" else 64
    scaled = v.dtype in tables.BLOCK_SCALED_DTYPES
    small_k = -(-v.tile_m // tables.SCALE_BLOCK) * tables.SCALE_BLOCK if scaled else v.tile_m  # whole scale blocks
    cases = [
        (f"{c} tiles / {clusters} CTAs", [per_tile] * c, per_tile * c, small_k, v.tile_n)
        for c in (max(1, clusters - 1), clusters, clusters + 1)
    ]
    if not quick:
        sizes = [0, 1, 300, 0, 77, 1000, 5, 0, 640]
        kdim = 1024 if scaled else 1016  # whole scale blocks
        ndim = 752 if v.epilogue == "gated" else 744  # whole gate and up block pairs
        cases.append(("uneven groups, rows left over", sizes, sum(sizes) + 123, kdim, ndim))
    if scaled and v.problem == "ragged_k":
        cases = [(label, s, token_tiles.padded_rows(rows, len(s)), k, n) for label, s, rows, k, n in cases]
    return cases


def grouped_plan(v: tables.Variant, groups: int, rows: int, kdim: int, ndim: int, device=None):
    view = (rows, ndim, kdim) if v.problem == "ragged_m" else (kdim, ndim, rows)
    plan = plan_ragged(
        *view,
        groups,
        problem=v.problem,
        dtype=v.dtype,  # the contract's name: mxe4m3 and e4m3 share numpy's dtype
        out_dtype=v.out,
        b_major=v.b_major,
        a_major=v.a_major,
        epilogue=v.epilogue,
        device=device,
        variant=v.name,
    )
    if plan.variant != v.name:
        raise RuntimeError(f"planner did not take {v.name}: {plan.reason}")
    return plan


def _check_grouped(v: tables.Variant, sizes, rows, kdim, ndim, key) -> tuple[float, float]:
    """ragged_m: [rows, kdim] x [G, kdim, ndim]; ragged_k: [rows, kdim]^T x [rows, ndim] per
    group. A gated row runs each activation, against act(gate) * up of the float32 product."""
    groups = len(sizes)
    dt = DTYPES[v.dtype]
    ka, kb = jax.random.split(key)
    a = jax.random.normal(ka, (rows, kdim), jnp.float32).astype(dt)
    if v.problem == "ragged_m":
        b_shape = (groups, kdim, ndim) if v.b_major == "n" else (groups, ndim, kdim)
    else:
        b_shape = (rows, ndim)
    b = jax.random.normal(kb, b_shape, jnp.float32).astype(dt)
    gs = jnp.asarray(sizes, jnp.int32)
    plan = grouped_plan(v, groups, rows, kdim, ndim)

    def products(a, b, gs):
        """(the kernel's output, the float32 reference's transform) per activation."""
        if v.epilogue != "gated":
            out = ragged(a, b, gs, problem=v.problem, b_major=v.b_major, out_dtype=DTYPES[v.out], plan=plan)
            return [(out, lambda ref: ref)]
        return [
            (
                gated(a, b, gs, b_major=v.b_major, activation=act, out_dtype=DTYPES[v.out], plan=plan),
                lambda ref, act=act: gate_product(ref, act, jnp.float32),
            )
            for act in tables.ACTIVATIONS
        ]

    @jax.jit
    def errors(a, b, gs):
        # one-hot group of every row; rows past the groups belong to none
        ends = jnp.cumsum(clamp_group_sizes(gs, rows))
        owner = jnp.searchsorted(ends, jnp.arange(rows), side="right")
        onehot = (owner[:, None] == jnp.arange(groups)[None, :]).astype(jnp.float32)
        a32, b32 = a.astype(jnp.float32), b.astype(jnp.float32)
        hi = lax.Precision.HIGHEST
        if v.problem == "ragged_m":
            bk = b32 if v.b_major == "n" else jnp.swapaxes(b32, 1, 2)
            ref = jnp.einsum("mg,mk,gkn->mn", onehot, a32, bk, precision=hi)
        else:
            ref = jnp.einsum("mg,mk,mn->gkn", onehot, a32, b32, precision=hi)
        # rows past the groups (ragged_m) and empty groups (ragged_k) must be exact zeros;
        # known from the groups, not from ref == 0, which random data can also give
        if v.problem == "ragged_m":
            must_be_zero = (onehot.sum(axis=1) == 0)[:, None]
        else:
            must_be_zero = (onehot.sum(axis=0) == 0)[:, None, None]
        rels, worsts = [], []
        for out, transform in products(a, b, gs):
            rel, worst = accuracy.errors(out, transform(ref))
            exact_zeros = jnp.where(must_be_zero, out == 0, True).all()
            rels.append(jnp.where(exact_zeros, rel, jnp.inf))
            worsts.append(jnp.where(exact_zeros, worst, jnp.inf))
        return jnp.max(jnp.stack(rels)), jnp.max(jnp.stack(worsts))

    rel, worst = jax.device_get(errors(a, b, gs))
    return float(rel), float(worst)


def scaled_grouped_operands(key, rows: int, n: int, k: int, groups: int, dtype, problem: str = "ragged_m", sizes=None):
    """Random fp8 operands and float32 block scales in [0.5, 2) in the grouped
    kernels' layouts. ragged_m: A [rows, K] (scales K-major), B [G, N, K]
    (each group's K blocks first). ragged_k: A [K, rows] and B [N, rows], both
    in token tiles (scales [rows/128, K] and [rows/128, N]). With `sizes`
    (int32 [G]): MX e8m0 scales in the MX grouped kernels' layouts, whose A
    scales follow the groups (ragged_m), or one layout of each whole
    operand, rows as K (ragged_k)."""
    ka, kb, ksa, ksb = jax.random.split(key, 4)
    if sizes is not None and problem == "ragged_k":
        a = jax.random.normal(ka, (k, rows), jnp.float32).astype(dtype)
        b = jax.random.normal(kb, (n, rows), jnp.float32).astype(dtype)
        scale_a = mx_scales.to_kernel_layout(mx_codes(ksa, k, rows), rows)
        return a, b, scale_a, mx_scales.to_kernel_layout(mx_codes(ksb, n, rows), rows)
    if sizes is not None:
        a = jax.random.normal(ka, (rows, k), jnp.float32).astype(dtype)
        b = jax.random.normal(kb, (groups, n, k), jnp.float32).astype(dtype)
        scale_a = mx_scales.grouped_to_kernel_layout(mx_codes(ksa, rows, k), clamp_group_sizes(sizes, rows), k)
        codes_b = jax.vmap(lambda key: mx_codes(key, n, k))(jax.random.split(ksb, groups))
        return a, b, scale_a, jax.vmap(lambda c: mx_scales.to_kernel_layout(c, k))(codes_b)
    if problem == "ragged_k":
        a = jax.random.normal(ka, (k, rows), jnp.float32).astype(dtype)
        b = jax.random.normal(kb, (n, rows), jnp.float32).astype(dtype)
        blocks = rows // tables.SCALE_BLOCK
        scale_a = jax.random.uniform(ksa, (blocks, k), jnp.float32, 0.5, 2.0)
        scale_b = jax.random.uniform(ksb, (blocks, n), jnp.float32, 0.5, 2.0)
        return a, b, scale_a, scale_b
    a = jax.random.normal(ka, (rows, k), jnp.float32).astype(dtype)
    b = jax.random.normal(kb, (groups, n, k), jnp.float32).astype(dtype)
    blocks = k // tables.SCALE_BLOCK
    scale_a = jax.random.uniform(ksa, (rows, blocks), jnp.float32, 0.5, 2.0)
    scale_b = jax.random.uniform(ksb, (groups, blocks, -(-n // tables.SCALE_BLOCK)), jnp.float32, 0.5, 2.0)
    return a, b, scale_a, scale_b


def _check_scaled_grouped(v: tables.Variant, sizes, rows, kdim, ndim, key) -> tuple[float, float]:
    """A block-scaled grouped variant against the float32 grouped product of
    the dequantized operands; rows past the groups (ragged_m) and empty
    groups (ragged_k, whose rows take the block-aligned layout) must be
    exact zeros."""
    groups = len(sizes)
    gs = jnp.asarray(sizes, jnp.int32)
    mx_sizes = gs if v.dtype == tables.MX_DTYPE else None
    operands = scaled_grouped_operands(key, rows, ndim, kdim, groups, DTYPES[v.dtype], v.problem, mx_sizes)
    plan = grouped_plan(v, groups, rows, kdim, ndim)
    bind = scaled_ragged_dot if v.problem == "ragged_m" else scaled_ragged_k_dot

    @jax.jit
    def errors(gs, *operands):
        out = bind(*operands, gs, out_dtype=DTYPES[v.out], plan=plan)
        ref = xla_scaled_ragged(*operands, gs, problem=v.problem, out_dtype=jnp.float32, plan=plan)
        rel, worst = accuracy.errors(out, ref)
        if v.problem == "ragged_m":
            past = (jnp.arange(rows) >= jnp.sum(clamp_group_sizes(gs, rows)))[:, None]
        else:
            past = (token_tiles.group_starts(gs, rows)[1] == 0)[:, None, None]
        exact_zeros = jnp.where(past, out == 0, True).all()
        return jnp.where(exact_zeros, rel, jnp.inf), jnp.where(exact_zeros, worst, jnp.inf)

    rel, worst = jax.device_get(errors(gs, *operands))
    return float(rel), float(worst)


def _run(check, count: int) -> list[tuple[float, float, str]]:
    """(rel, max rel, error) per case; an exception fails every case it covers
    but not the run: the table is the product."""
    try:
        return [(rel, worst, "") for rel, worst in check()]
    except Exception as exc:
        return [(float("nan"), float("nan"), f"{type(exc).__name__}: {exc}")] * count


def _variant_rows(v: tables.Variant, clusters: int, quick: bool, key):
    """[(schedule, label, (rel, max rel, error))] for one variant."""
    if v.problem == "dense":
        rows = [(s, label, mnk) for s in v.schedules for label, *mnk in dense_cases(v, clusters, quick)]
        check = _check_scaled if v.dtype in tables.BLOCK_SCALED_DTYPES else _check_dense
        results = _run(lambda: check(v, [dense_plan(v, s, *mnk) for s, _, mnk in rows], key), len(rows))
        return [(s, label, result) for (s, label, _), result in zip(rows, results)]
    rows = []
    check = _check_scaled_grouped if v.dtype in tables.BLOCK_SCALED_DTYPES else _check_grouped
    for label, *case in grouped_cases(v, clusters, quick):
        key, sub = jax.random.split(key)
        rows.append((v.schedules[0], label, _run(lambda c=case, k=sub: [check(v, *c, k)], 1)[0]))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="boundary shapes only")
    parser.add_argument("--only", default="", help="variants whose name matches this regular expression")
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(8, os.cpu_count() or 1),
        help="variants compiled at once (compilation, not the GPU, dominates the run time)",
    )
    args = parser.parse_args(argv)
    try:
        only = re.compile(args.only)
    except re.error as exc:
        parser.error(f"--only {args.only!r} is not a regular expression: {exc}")
    dev = describe()
    if dev.arch is None or not _ffi.with_kernels():
        why = _ffi.why_no_kernels() or f"no kernel family for {dev.platform} {dev.name}"
        print(f"nothing to test: {why}")
        return 2
    menu = [
        v
        for v in tables.load_menu()
        if v.arch == dev.arch and v.name in _ffi.compiled_variant_names() and only.search(v.name)
    ]
    print(
        f"{dev.name} (cc {dev.compute_capability[0]}.{dev.compute_capability[1]}, "
        f"{dev.sm_count} SMs): {len(menu)} {dev.arch} variants"
    )
    keys = jax.random.split(jax.random.key(0), max(1, len(menu)))
    failures = 0
    print(f"{'variant':<80} {'schedule':<9} {'problem':<34} {'rel err':>9} {'max rel':>9}  result")
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        clusters = [_ffi.extension().max_active_clusters(v.name, dev.device_id) for v in menu]
        pending = [
            pool.submit(_variant_rows, v, c, args.quick, k) if c >= 1 else None for v, c, k in zip(menu, clusters, keys)
        ]
        for v, job in zip(menu, pending):  # printed in menu order, whatever finishes first
            if job is None:
                print(f"{v.name:<80} {'-':<9} {'cannot be resident':<34} {'':>9} {'':>9}  FAIL")
                failures += 1
                continue
            for schedule, label, (rel, worst, error) in job.result():
                ok = not error and rel < tolerance(v.out, v.dtype)
                failures += not ok
                label = f"{label} ({error})"[:120] if error else label
                print(
                    f"{v.name:<80} {schedule:<9} {label:<34} {rel:9.2e} {worst:9.2e}  {'pass' if ok else 'FAIL'}",
                    flush=True,
                )
    print(f"{'all passed' if not failures else f'{failures} FAILED'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
