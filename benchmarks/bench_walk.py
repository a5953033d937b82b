"""The work queue's tile walk: raster and band width, pinned, against XLA.

For each shape, times the dynamic (work-queue) row with each raster and
swizzle (band width) pinned, and XLA's dot, in interleaved rounds, so that a
clock that drifts over the run (a hot card) moves every candidate alike.
Reports each candidate's median over the rounds and which one the planner
picks, and writes JSON and a PNG.

    python benchmarks/bench_walk.py --out benchmarks/results/h200
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import common  # noqa: E402

import jax_cluster  # noqa: E402
from jax_cluster.tuning import timing  # noqa: E402
from jax_cluster.tuning.accuracy import relative_error  # noqa: E402

SHAPES = [(8448, 8448, 4096), (8192, 28672, 8192), (8192, 14336, 4096), (8192, 8192, 8192)]
WALKS = [(raster, swizzle) for raster in ("along_n", "along_m") for swizzle in (1, 8)]


def _label(raster, swizzle) -> str:
    return f"{raster} sw{swizzle}"


def bench_shape(m, n, k, rounds, iterations):
    ka, kb = jax.random.split(jax.random.key(m + n + k))
    sets = timing.rotation((m * k + k * n + m * n) * 2)
    args = [
        (
            common.randn(jax.random.fold_in(ka, i), (m, k), jnp.bfloat16),
            common.randn(jax.random.fold_in(kb, i), (k, n), jnp.bfloat16),
        )
        for i in range(sets)
    ]
    fns = {"xla": lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.bfloat16)}
    for raster, swizzle in WALKS:
        plan = jax_cluster.plan(m, n, k, dtype=jnp.bfloat16, schedule="dynamic", raster=raster, swizzle=swizzle)
        fns[_label(raster, swizzle)] = (lambda p: lambda a, b: jax_cluster.matmul(a, b, plan=p))(plan)
    ref = jax.jit(fns["xla"])(*args[0]).astype(jnp.float32)
    for name, fn in fns.items():  # same answer as XLA before any timing
        err = float(relative_error(jax.jit(fn)(*args[0]), ref))
        if not err < 1e-2:
            raise RuntimeError(f"{m}x{n}x{k} {name}: relative error {err:.2e}")
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(timing.cupti_ms(fn, args, iterations))
    chosen = jax_cluster.plan(m, n, k, dtype=jnp.bfloat16)
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    return {
        "m": m,
        "n": n,
        "k": k,
        "rounds": times,
        "median_ms": medians,
        "planner": {
            "variant": chosen.variant,
            "schedule": chosen.schedule,
            "raster": chosen.raster,
            "swizzle": chosen.swizzle,
        },
    }


def plot(payload, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = payload["rows"]
    names = list(rows[0]["median_ms"])
    fig, ax = plt.subplots(figsize=(10, 5))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        ratios = [r["median_ms"]["xla"] / r["median_ms"][name] for r in rows]
        ax.bar([x + i * width for x in range(len(rows))], ratios, width, label=name)
    ax.set_xticks(
        [x + 0.4 - width / 2 for x in range(len(rows))], [f"{r['m']}x{r['n']}x{r['k']}" for r in rows], fontsize=8
    )
    ax.set_ylim(0.85, 1.05)
    ax.set_ylabel("speed relative to XLA (device time)")
    ax.set_title(f"work-queue walk, raster x band width, {payload['device']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_out_argument(ap)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=10)
    args = ap.parse_args(argv)
    rows = []
    for m, n, k in SHAPES:
        row = bench_shape(m, n, k, args.rounds, args.iterations)
        rows.append(row)
        med = row["median_ms"]
        pick = _label(row["planner"]["raster"], row["planner"]["swizzle"])
        cells = "  ".join(f"{name} {ms:.4f}" for name, ms in med.items())
        print(
            f"{m:5d}x{n:6d}x{k:6d}  {cells}  planner: {pick} ({med['xla'] / med.get(pick, float('nan')):.3f}x XLA)",
            flush=True,
        )
    payload = {"device": common.device_name(), "rows": rows}
    common.write_results(common.results_dir(args.out), "walk_bf16", payload, plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
