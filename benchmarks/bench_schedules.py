"""Measured schedule ranking against the tail simulator's, on boundary shapes.

For tile counts just below, at and just above the resident clusters (and the
same around two waves), every schedule the planner can run for the shape is
timed with CUPTI device time, and the measured order is compared with the
order jax_cluster.planning.schedule.simulate predicts for equal tiles. Writes JSON and
a PNG next to the other H200 results.

    python benchmarks/bench_schedules.py --out benchmarks/results/h200
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import common  # noqa: E402

import jax_cluster  # noqa: E402
from jax_cluster.planning import schedule as sim  # noqa: E402
from jax_cluster.planning.cost_model import DYNAMIC_FETCH_OVERHEAD, STATIC_STEP_OVERHEAD  # noqa: E402
from jax_cluster.tuning import timing  # noqa: E402
from jax_cluster.tuning.accuracy import relative_error  # noqa: E402

SCHEDULES = ("static", "dynamic", "stream_k")
K = 4096
NOISE = 0.02  # timings closer than this count as a tie


def boundary_shapes(probe) -> list[tuple[str, int, int]]:
    """(label, m, n): cluster-tile counts around one and two waves."""
    c = probe.max_active_clusters
    cm = probe.tile_m * probe.cluster_m
    out = []
    for waves in (1, 2):
        for delta in (-1, 0, 1):
            tiles = waves * c + delta
            out.append((f"{waves}x{c}{delta:+d}" if delta else f"{waves}x{c}", cm, probe.tile_n * tiles))
    return out


def predicted(tiles: int, clusters: int, k_tiles: int) -> dict[str, float]:
    sims = sim.compare(
        sim.uniform_tiles(tiles),
        clusters,
        schedules=SCHEDULES,
        fetch_overhead=DYNAMIC_FETCH_OVERHEAD,
        step_overhead=STATIC_STEP_OVERHEAD,
        fixup_cost=0.1,
        k_iters=[k_tiles] * tiles,
    )
    return {s: r.makespan for s, r in sims.items()}


def ranking(times: dict[str, float]) -> list[list[str]]:
    """Schedules fastest first, those within NOISE of each other grouped as ties."""
    order = sorted(times, key=times.get)
    groups = [[order[0]]]
    for s in order[1:]:
        if times[s] <= times[groups[-1][0]] * (1 + NOISE):
            groups[-1].append(s)
        else:
            groups.append([s])
    return groups


def agrees(pred: list[list[str]], meas: list[list[str]]) -> bool:
    """Same winner, allowing ties on either side."""
    return bool(set(pred[0]) & set(meas[0]))


def bench(label, m, n, iterations, probe):
    keys = jax.random.split(jax.random.key(m + n), 2)
    a = common.randn(keys[0], (m, K), jnp.bfloat16)
    b = common.randn(keys[1], (K, n), jnp.bfloat16)
    ref = jnp.dot(a.astype(jnp.float32), b.astype(jnp.float32))
    times, plans = {}, {}
    for s in SCHEDULES:
        # the probe's tile and cluster for every schedule: the comparison is of
        # schedules, so a memory-bound shape must not move static to another row
        plan = jax_cluster.plan(
            m,
            n,
            K,
            dtype=jnp.bfloat16,
            schedule=s,
            tile=(probe.tile_m, probe.tile_n, probe.tile_k),
            cluster=(probe.cluster_m, probe.cluster_n),
        )
        out = jax.jit(lambda a, b, p=plan: jax_cluster.matmul(a, b, plan=p))(a, b)
        err = float(relative_error(out, ref))
        if err > 2e-2:
            raise RuntimeError(f"{label} {s}: relative error {err}")
        times[s] = timing.cupti_ms(lambda a, b, p=plan: jax_cluster.matmul(a, b, plan=p), [(a, b)], iterations)
        plans[s] = plan
    p = plans["static"]
    tiles = round(p.waves * p.max_active_clusters)
    pred = predicted(tiles, p.max_active_clusters, -(-K // p.tile_k))
    row = {
        "label": label,
        "m": m,
        "n": n,
        "k": K,
        "cluster_tiles": tiles,
        "clusters": p.max_active_clusters,
        "measured_ms": times,
        "simulated": pred,
        "variants": {s: plans[s].variant for s in SCHEDULES},
        "measured_rank": ranking(times),
        "simulated_rank": ranking(pred),
    }
    row["agrees"] = agrees(row["simulated_rank"], row["measured_rank"])
    return row


def plot(payload, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = payload["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    x = range(len(rows))
    for i, s in enumerate(SCHEDULES):
        base = [r["measured_ms"]["static"] for r in rows]
        axes[0].bar(
            [j + 0.27 * (i - 1) for j in x], [r["measured_ms"][s] / b for r, b in zip(rows, base)], 0.27, label=s
        )
        axes[1].bar(
            [j + 0.27 * (i - 1) for j in x], [r["simulated"][s] / r["simulated"]["static"] for r in rows], 0.27, label=s
        )
    for ax, title in zip(axes, ("measured (CUPTI), / static", "simulated, / static")):
        ax.set_xticks(list(x), [r["label"] for r in rows], rotation=30)
        ax.set_title(title)
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.legend()
    fig.suptitle(f"Schedules at boundary tile counts, {payload['device']}, K={K}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_out_argument(ap)
    ap.add_argument("--iterations", type=int, default=20)
    args = ap.parse_args(argv)
    probe = jax_cluster.plan(8192, 8192, K, dtype=jnp.bfloat16, schedule="dynamic")
    if not probe.uses_kernel:
        print(f"no kernel for this device: {probe.reason}")
        return 2
    rows = [bench(label, m, n, args.iterations, probe) for label, m, n in boundary_shapes(probe)]
    for r in rows:
        t = r["measured_ms"]
        print(
            f"{r['label']:>10} tiles={r['cluster_tiles']:>4}  "
            + "  ".join(f"{s} {t[s]:.4f} ms" for s in SCHEDULES)
            + f"  measured {r['measured_rank']}  simulated {r['simulated_rank']}  "
            f"{'agrees' if r['agrees'] else 'DISAGREES'}"
        )
    payload = {
        "device": common.device_name(),
        "noise": NOISE,
        "rows": rows,
        "agreement": sum(r["agrees"] for r in rows) / len(rows),
    }
    print(f"simulator picks the measured winner on {payload['agreement']:.0%} of the shapes")
    common.write_results(common.results_dir(args.out), "schedules_bf16", payload, plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
