"""Runs every compiled variant for the present GPU against XLA.

    python -m jax_cluster.selftest [--quick]

For each variant and each schedule it can run: tile counts one below, equal
to and one above the resident clusters (cudaOccupancyMaxActiveClusters), and
odd but TMA-aligned M/N/K. Prints a pass/fail table with the relative errors
against a float32 XLA reference and exits non-zero on any failure; exits 2
when there is nothing to test (no GPU of a compiled architecture).
"""
from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
from jax import lax

from jax_cluster import _ffi, variants
from jax_cluster.device import describe
from jax_cluster.plan import plan_gemm
from jax_cluster.primitives import gemm

ODD_SHAPES = [(7, 24, 8), (129, 136, 72), (333, 2056, 1000), (1000, 1016, 4104)]
DTYPES = {"bf16": jnp.bfloat16, "f16": jnp.float16, "f32": jnp.float32}
TOLERANCE = {"bf16": 1e-2, "f16": 2e-3, "f32": 1e-4}


def _boundary_shapes(v: variants.Variant, clusters: int, k: int = 512):
    """Problems whose cluster tiles number clusters - 1, clusters and clusters + 1."""
    rows = v.cta_tile_m * v.cluster_m
    cols = v.tile_n * v.cluster_n
    return [(f"{count} tiles / {clusters} clusters", rows, cols * count, k)
            for count in (max(1, clusters - 1), clusters, clusters + 1)]


def _check(v: variants.Variant, schedule: str, m: int, n: int, k: int, key) -> tuple[float, float]:
    """(norm-relative, max-relative) error of the variant against XLA in float32."""
    extra = {"splits": 2} if schedule == "split_k" else {}
    plan = plan_gemm(m, n, k, dtype=DTYPES[v.dtype], out_dtype=DTYPES[v.out], a_major=v.a_major,
                     b_major=v.b_major, variant=v.name, schedule=schedule, **extra)
    if plan.variant != v.name:
        raise RuntimeError(f"planner did not take {v.name}: {plan.reason}")
    ka, kb = jax.random.split(key)
    a = jax.random.normal(ka, (m, k) if v.a_major == "k" else (k, m), jnp.float32)
    b = jax.random.normal(kb, (n, k) if v.b_major == "k" else (k, n), jnp.float32)
    a, b = a.astype(DTYPES[v.dtype]), b.astype(DTYPES[v.dtype])

    @jax.jit
    def errors(a, b):
        out = gemm(a, b, a_major=v.a_major, b_major=v.b_major, out_dtype=DTYPES[v.out],
                   plan=plan).astype(jnp.float32)
        dims = (((1 if v.a_major == "k" else 0,), (1 if v.b_major == "k" else 0,)), ((), ()))
        ref = lax.dot_general(a.astype(jnp.float32), b.astype(jnp.float32), dims,
                              precision=lax.Precision.HIGHEST)
        finite = jnp.isfinite(out).all()  # a skipped or NaN element fails outright
        rel = jnp.linalg.norm(out - ref) / jnp.linalg.norm(ref)
        worst = jnp.abs(out - ref).max() / jnp.abs(ref).max()
        return jnp.where(finite, rel, jnp.inf), jnp.where(finite, worst, jnp.inf)

    rel, worst = jax.device_get(errors(a, b))
    return float(rel), float(worst)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="boundary shapes only")
    args = parser.parse_args(argv)
    dev = describe()
    if dev.arch is None or not _ffi.with_kernels():
        why = _ffi.why_no_kernels() or f"no kernel family for {dev.platform} {dev.name}"
        print(f"nothing to test: {why}")
        return 2
    menu = [v for v in variants.load_menu()
            if v.arch == dev.arch and v.name in _ffi.compiled_variant_names()]
    print(f"{dev.name} (cc {dev.compute_capability[0]}.{dev.compute_capability[1]}, "
          f"{dev.sm_count} SMs): {len(menu)} {dev.arch} variants")
    key = jax.random.key(0)
    failures = 0
    print(f"{'variant':<72} {'schedule':<9} {'problem':<34} {'rel err':>9} {'max rel':>9}  result")
    for v in menu:
        clusters = _ffi.extension().max_active_clusters(v.name, dev.device_id)
        if clusters < 1:
            print(f"{v.name:<72} {'-':<9} {'cannot be resident':<34} {'':>9} {'':>9}  FAIL")
            failures += 1
            continue
        cases = _boundary_shapes(v, clusters)
        if not args.quick:
            cases += [(f"{m}x{n}x{k}", m, n, k) for m, n, k in ODD_SHAPES]
        for schedule in v.schedules:
            for label, m, n, k in cases:
                key, sub = jax.random.split(key)
                try:
                    rel, worst = _check(v, schedule, m, n, k, sub)
                    ok = rel < TOLERANCE[v.out]
                except Exception as exc:  # report and continue: the table is the product
                    rel = worst = float("nan")
                    ok = False
                    label = f"{label} ({type(exc).__name__}: {exc})"[:120]
                failures += not ok
                print(f"{v.name:<72} {schedule:<9} {label:<34} {rel:9.2e} {worst:9.2e}  "
                      f"{'pass' if ok else 'FAIL'}", flush=True)
    print(f"{'all passed' if not failures else f'{failures} FAILED'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
