"""jax_cluster.matmul against XLA's dot under jax.jit, side by side on one GPU.

Device time comes from CUPTI, so launch overhead does not distort small
shapes. Prints a table and writes JSON and a PNG chart.

    python benchmarks/bench_matmul.py --out benchmarks/results/h200
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
from jax_cluster.planning import cost_model  # noqa: E402
from jax_cluster.tuning import timing  # noqa: E402
from jax_cluster.tuning.accuracy import relative_error  # noqa: E402

SUITE = [
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (8192, 14336, 4096),
    (8192, 4096, 14336),
    (8192, 6144, 4096),
    (8192, 28672, 8192),
    (2304, 2304, 16384),
    (4352, 4352, 8192),
    (1536, 1536, 32768),
    (8448, 8448, 4096),
    (128, 8192, 8192),
    (256, 28672, 8192),
    (64, 4096, 4096),
    (16, 14336, 4096),
]


# shapes with M <= this must reach ROOFLINE_TARGET of the HBM roofline
SMALL_M = 256
ROOFLINE_TARGET = 0.85


def xla_dot(a, b):
    return jnp.dot(a, b, preferred_element_type=a.dtype)


def hbm_bandwidth(iterations) -> float:
    """Measured HBM bytes/s over 1 GiB, far past L2: the faster of an elementwise
    pass (read + write) and a sum (read only); a GEMM's bytes are mostly reads."""
    x = common.randn(jax.random.key(7), (1 << 29,), jnp.bfloat16)
    copy = 2 * x.nbytes / (timing.cupti_ms(lambda x: x + 1, [(x,)], iterations) * 1e-3)
    read = x.nbytes / (timing.cupti_ms(lambda x: jnp.sum(x, dtype=jnp.float32), [(x,)], iterations) * 1e-3)
    return max(copy, read)


def roofline_share(m, n, k, itemsize, ms, bandwidth) -> float:
    """The HBM time of the bytes that must move (A, B read once, D written once) over the time taken."""
    return cost_model.bytes_moved(m, n, k, 1, itemsize, itemsize) / bandwidth / (ms * 1e-3)


def bench_shape(m, n, k, dtype, iterations):
    keys = jax.random.split(jax.random.key(m * 131 + n * 7 + k), 64)
    sets = timing.rotation((m * k + k * n + m * n) * jnp.dtype(dtype).itemsize)
    args = [
        (common.randn(keys[2 * i], (m, k), dtype), common.randn(keys[2 * i + 1], (k, n), dtype)) for i in range(sets)
    ]
    ours = jax.jit(jax_cluster.matmul)(*args[0])
    ref = jax.jit(xla_dot)(*args[0])
    err = float(relative_error(ours, ref.astype(jnp.float32)))
    t_xla = timing.cupti_ms(xla_dot, args, iterations)
    t_ours = timing.cupti_ms(jax_cluster.matmul, args, iterations)
    plan = jax_cluster.plan(m, n, k, dtype=dtype)
    flops = 2 * m * n * k
    return {
        "m": m,
        "n": n,
        "k": k,
        "dtype": jnp.dtype(dtype).name,
        "xla_ms": t_xla,
        "jax_cluster_ms": t_ours,
        "xla_tflops": flops / t_xla / 1e9,
        "jax_cluster_tflops": flops / t_ours / 1e9,
        "ratio": t_xla / t_ours,
        "rel_err_vs_xla": err,
        "rotated_input_sets": sets,
        "plan": {
            "path": plan.path,
            "variant": plan.variant,
            "schedule": plan.schedule,
            "splits": plan.splits,
            "raster": plan.raster,
            "swizzle": plan.swizzle,
            "waves": plan.waves,
            "max_active_clusters": plan.max_active_clusters,
            "reason": plan.reason,
        },
    }


def plot(payload, path):
    rows = payload["rows"]
    common.plot_pairs(
        path,
        [f"{r['m']}x{r['n']}x{r['k']}" for r in rows],
        [r["xla_tflops"] for r in rows],
        [r["jax_cluster_tflops"] for r in rows],
        baseline_label="XLA dot",
        ratios=[r["ratio"] for r in rows],
        ylabel="TFLOP/s (device time, CUPTI)",
        title=f"matmul bf16 on {payload['device']} (jax {payload['jax_version']})",
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    common.add_out_argument(parser)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--shapes", type=str, default="", help="MxNxK,... (default: the suite)")
    common.add_route_argument(parser)
    args = parser.parse_args()
    common.set_route(args.route)
    suite = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SUITE
    rows = []
    bandwidth = hbm_bandwidth(args.iterations)
    print(f"measured HBM bandwidth {bandwidth / 1e12:.2f} TB/s")
    print(f"{'shape':>22} {'XLA TF/s':>9} {'ours TF/s':>9} {'ratio':>6} {'roofline':>8}  plan")
    for m, n, k in suite:
        r = bench_shape(m, n, k, jnp.bfloat16, args.iterations)
        for side in ("xla", "jax_cluster"):
            r[f"{side}_roofline"] = roofline_share(m, n, k, 2, r[f"{side}_ms"], bandwidth)
        rows.append(r)
        p = r["plan"]
        print(
            f"{m:>6}x{n:>6}x{k:>6} {r['xla_tflops']:9.1f} {r['jax_cluster_tflops']:9.1f} "
            f"{r['ratio']:6.2f} {r['jax_cluster_roofline']:8.0%}  {p['path']} {p['variant']} "
            f"{p['schedule']}{'/' + str(p['splits']) if p['schedule'] == 'split_k' else ''} "
            f"err={r['rel_err_vs_xla']:.1e}",
            flush=True,
        )
    ratios = [r["ratio"] for r in rows]
    big = [r["ratio"] for r in rows if r["m"] >= 1536]
    small = [r["jax_cluster_roofline"] for r in rows if r["m"] <= SMALL_M]
    payload = {
        "device": common.device_name(),
        "jax_version": jax.__version__,
        "info": str(jax_cluster.info()),
        "hbm_bandwidth_bytes_per_s": bandwidth,
        "rows": rows,
        "geomean_ratio": statistics.geometric_mean(ratios),
        "min_ratio": min(ratios),
        "min_ratio_m_ge_1536": min(big) if big else None,
        "min_roofline_m_le_256": min(small) if small else None,
    }
    print(
        f"geomean ratio {payload['geomean_ratio']:.3f} (target >= 1.0); min ratio "
        f"{payload['min_ratio']:.3f} (target >= 0.95); min ratio (M>=1536) "
        f"{payload['min_ratio_m_ge_1536']}"
    )
    if small:
        print(f"M <= {SMALL_M}: lowest share of the HBM roofline {min(small):.0%} (target {ROOFLINE_TARGET:.0%})")
    common.write_results(common.results_dir(args.out), common.route_stem("matmul_bf16", args.route), payload, plot)


if __name__ == "__main__":
    main()
