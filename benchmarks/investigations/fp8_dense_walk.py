"""The block-scaled fp8 dense kernel's tile walk: raster and swizzle, pinned.

The kernel runs CUTLASS's static persistent scheduler, whose walk (raster
along M or N, swizzle 1-8) is a launch argument, not a menu row: this times
each walk on the fp8 dense suite (`bench_fp8_dense.SHAPES`) beside the
planner's own choice and `torch._scaled_mm` with row-wise scales, in
interleaved rounds so that a clock that drifts moves every candidate alike.
Each walk is checked against the float32 product of the dequantized
operands before it is timed. Writes fp8_dense_walk.json and a PNG.

    python benchmarks/investigations/fp8_dense_walk.py --out benchmarks/results/h100/investigations
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
import bench_fp8_dense as fp8  # noqa: E402
import bench_ragged  # noqa: E402
import common  # noqa: E402

import jax_cluster  # noqa: E402

WALKS = [(raster, swizzle) for raster in ("along_m", "along_n") for swizzle in (1, 4, 8)]


def _label(raster, swizzle) -> str:
    return f"{raster} sw{swizzle}"


def bench_shape(torch, m, n, k, rounds, iterations) -> dict:
    chosen = jax_cluster.plan(m, n, k, dtype=fp8.E4M3, out_dtype=jnp.bfloat16, b_major="k")
    if chosen.path != "kernel":
        return {"m": m, "n": n, "k": k, "error": chosen.reason}
    plans = {"planner": chosen}
    for raster, swizzle in WALKS:
        plans[_label(raster, swizzle)] = jax_cluster.plan(
            m, n, k, dtype=fp8.E4M3, out_dtype=jnp.bfloat16, b_major="k",
            variant=chosen.variant, schedule=chosen.schedule, raster=raster, swizzle=swizzle,
        )  # fmt: skip
    errors = {name: fp8.check(m, n, k, plan) for name, plan in plans.items()}
    bad = {name: err for name, err in errors.items() if not err < fp8.REL_ERR_BOUND}
    if bad:
        raise RuntimeError(f"{m}x{n}x{k}: relative error past {fp8.REL_ERR_BOUND}: {bad}")
    kernel_args = fp8.kernel_operands(m, n, k)
    times = {name: [] for name in plans}
    if torch is not None:
        times["torch"] = []
    for _ in range(rounds):
        for name, plan in plans.items():
            times[name].append(fp8.time_kernel(plan, kernel_args, iterations))
        if torch is not None:
            times["torch"].append(fp8.time_torch(torch, m, n, k, iterations))
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    walks = {name: ms for name, ms in medians.items() if name not in ("planner", "torch")}
    best = min(walks, key=walks.get)
    return {
        "m": m,
        "n": n,
        "k": k,
        "variant": chosen.variant,
        "planner": {"raster": chosen.raster, "swizzle": chosen.swizzle},
        "rel_err_vs_dequantized_f32": max(errors.values()),
        "rounds": times,
        "median_ms": medians,
        "best_walk": best,
        "planner_vs_best": walks[best] / medians["planner"],
        "torch_vs_planner": medians["torch"] / medians["planner"] if torch is not None else None,
        "torch_vs_best": medians["torch"] / walks[best] if torch is not None else None,
    }


def plot(payload, path):
    rows = [r for r in payload["rows"] if r.get("torch_vs_best")]
    common.plot_pairs(
        path,
        [f"{r['model']} {r['m']}x{r['n']}x{r['k']}\nbest: {r['best_walk']}" for r in rows],
        [r["median_ms"]["planner"] for r in rows],
        [r["median_ms"][r["best_walk"]] for r in rows],
        baseline_label="planner's walk",
        ours_label="best walk",
        ratios=[r["median_ms"]["torch"] / r["median_ms"][r["best_walk"]] for r in rows],
        ylabel="ms (device time); label: torch row-wise / best walk",
        title=f"fp8 block-scaled dense: raster x swizzle, {payload['device']}",
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_out_argument(ap)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=10)
    args = ap.parse_args(argv)
    torch, why_no_torch = bench_ragged.load_torch_with("_scaled_mm")
    rows = []
    for model, m, n, k in fp8.SHAPES:
        row = {"model": model, **bench_shape(torch, m, n, k, args.rounds, args.iterations)}
        rows.append(row)
        print(json.dumps({key: row.get(key) for key in ("model", "m", "n", "k", "planner", "best_walk",
                                                         "planner_vs_best", "torch_vs_planner", "torch_vs_best")}),
              flush=True)  # fmt: skip
        payload = {
            "device": common.device_name(),
            **common.run_record(),
            "torch_error": why_no_torch,
            "summary": {
                "geomean_torch_vs_planner": bench_ragged.geomean(r.get("torch_vs_planner") for r in rows),
                "geomean_torch_vs_best": bench_ragged.geomean(r.get("torch_vs_best") for r in rows),
            },
            "rows": rows,
        }
        common.write_results(common.results_dir(args.out), "fp8_dense_walk", payload, plot)
    print(json.dumps(payload["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
