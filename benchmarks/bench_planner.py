"""The planner's choice against the best of the whole menu, by exhaustive timing.

For every shape of the matmul suite, `jax_cluster.autotune` (without writing
its cache) times every compiled candidate with CUPTI device time; the plan
the planner makes on its own is one of those candidates. A shape passes when
the planner's candidate is within 5% of the fastest kernel candidate.

    python benchmarks/bench_planner.py --out benchmarks/results/h200
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import bench_matmul  # noqa: E402
import common  # noqa: E402

import jax_cluster  # noqa: E402

TOLERANCE = 1.05
TARGET_SHARE = 0.90
_PINNED = ("variant", "schedule", "splits", "raster")


def _same_choice(overrides: dict, plan) -> bool:
    return all(overrides.get(f, getattr(plan, f)) == getattr(plan, f) for f in _PINNED) and (
        overrides.get("path") != "xla"
    )


def judge(shape, result) -> dict:
    m, n, k = shape
    plan = jax_cluster.plan(m, n, k, dtype=jnp.bfloat16)
    kernels = [t for t in result.timings if t.ms is not None and t.overrides.get("path") != "xla"]
    mine = [t for t in kernels if _same_choice(t.overrides, plan)] if plan.uses_kernel else []
    row = {
        "m": m,
        "n": n,
        "k": k,
        "timer": result.timer,
        "xla_ms": result.xla_ms,
        "planner": {f: getattr(plan, f) for f in ("path",) + _PINNED},
        "candidates": [{"overrides": t.overrides, "ms": t.ms, "error": t.error} for t in result.timings],
    }
    if not kernels:
        row.update(best=None, planner_ms=None, ratio=None, within=plan.path == "xla")
        return row
    best = min(kernels, key=lambda t: t.ms)
    planner_ms = mine[0].ms if mine else (result.xla_ms if plan.path == "xla" else None)
    ratio = None if planner_ms is None else planner_ms / best.ms
    row.update(
        best={"overrides": best.overrides, "ms": best.ms},
        planner_ms=planner_ms,
        ratio=ratio,
        within=ratio is not None and ratio <= TOLERANCE,
    )
    return row


def plot(payload, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = payload["rows"]
    labels = [f"{r['m']}x{r['n']}x{r['k']}" for r in rows]
    ratios = [r["ratio"] or 0 for r in rows]
    fig, ax = plt.subplots(figsize=(11, 4))
    ax.bar(range(len(rows)), ratios, color=["tab:green" if r["within"] else "tab:red" for r in rows])
    ax.axhline(TOLERANCE, color="grey", ls="--", label="5% of the best")
    ax.set_xticks(range(len(rows)), labels, rotation=40, ha="right")
    ax.set_ylabel("planner time / best menu time")
    ax.set_title(
        f"Planner vs exhaustive timing, {payload['device']}: {payload['share_within']:.0%} of shapes within 5%"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_out_argument(ap)
    ap.add_argument("--iters", type=int, default=10)
    common.add_route_argument(ap)
    args = ap.parse_args(argv)
    common.set_route(args.route)
    shapes = bench_matmul.SUITE
    results = jax_cluster.autotune(shapes, cache=False, progress=False, iters=args.iters)
    rows = [judge(shape, results[shape]) for shape in shapes]
    for r in rows:
        best = r["best"]["overrides"] if r["best"] else None
        print(
            f"{r['m']:>5}x{r['n']:>5}x{r['k']:>5}  planner {r['planner_ms']}  best "
            f"{r['best']['ms'] if r['best'] else None}  ratio {r['ratio']}  "
            f"{'ok' if r['within'] else 'MISS'}  best={best}"
        )
    share = sum(r["within"] for r in rows) / len(rows)
    payload = {
        "device": common.device_name(),
        "tolerance": TOLERANCE,
        "rows": rows,
        "share_within": share,
        "target_share": TARGET_SHARE,
    }
    print(
        f"planner within 5% of the best menu candidate on {share:.0%} of {len(rows)} shapes (target {TARGET_SHARE:.0%})"
    )
    common.write_results(
        common.results_dir(args.out), common.route_stem("planner_vs_exhaustive", args.route), payload, plot
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
