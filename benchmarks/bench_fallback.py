"""jax_cluster's XLA fallback against XLA's own dot, side by side on one GPU.

A call the kernels do not take (misaligned, another dtype, or `path="xla"`)
runs `lax.dot_general` inside jax_cluster's primitive. It should cost what
`jnp.dot` costs: this times both (CUPTI device time, inputs rotated past L2)
and checks both against a float32 reference.

    python benchmarks/bench_fallback.py --out benchmarks/results/h200
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
from jax_cluster.tuning import timing  # noqa: E402
from jax_cluster.tuning.accuracy import relative_error  # noqa: E402

SHAPES = [(8448, 8448, 4096), (4096, 4096, 4096), (64, 4096, 4096), (1000, 1000, 1)]


def bench_shape(m, n, k, iterations):
    keys = jax.random.split(jax.random.key(m + 3 * n + 7 * k), 64)
    sets = timing.rotation((m * k + k * n + m * n) * 2)
    args = [
        (common.randn(keys[2 * i], (m, k), jnp.bfloat16), common.randn(keys[2 * i + 1], (k, n), jnp.bfloat16))
        for i in range(sets)
    ]
    plan = jax_cluster.plan(m, n, k, dtype=jnp.bfloat16, path="xla")
    ours = lambda a, b: jax_cluster.matmul(a, b, plan=plan)  # noqa: E731
    ref = jnp.dot(args[0][0].astype(jnp.float32), args[0][1].astype(jnp.float32))
    errs = {}
    for name, fn in (("xla", jnp.dot), ("fallback", ours)):
        errs[name] = float(relative_error(jax.jit(fn)(*args[0]), ref))
    t_xla = timing.cupti_ms(jnp.dot, args, iterations)
    t_ours = timing.cupti_ms(ours, args, iterations)
    return {
        "m": m,
        "n": n,
        "k": k,
        "xla_ms": t_xla,
        "fallback_ms": t_ours,
        "ratio": t_xla / t_ours,
        "rel_err": errs,
        "rotated_input_sets": sets,
    }


def plot(payload, path):
    rows = payload["rows"]
    common.plot_pairs(
        path,
        [f"{r['m']}x{r['n']}x{r['k']}" for r in rows],
        [r["xla_ms"] for r in rows],
        [r["fallback_ms"] for r in rows],
        baseline_label="jnp.dot",
        ours_label="jax_cluster fallback",
        ratios=[r["ratio"] for r in rows],
        ylabel="ms (device time, CUPTI)",
        title=f"XLA fallback, bf16, on {payload['device']}",
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_out_argument(parser)
    parser.add_argument("--iterations", type=int, default=10)
    args = parser.parse_args()
    rows = []
    print(f"{'shape':>20} {'jnp.dot ms':>10} {'fallback ms':>11} {'ratio':>6}  rel err (dot, fallback)")
    for m, n, k in SHAPES:
        r = bench_shape(m, n, k, args.iterations)
        rows.append(r)
        print(
            f"{m:>6}x{n:>6}x{k:>5} {r['xla_ms']:10.4f} {r['fallback_ms']:11.4f} {r['ratio']:6.2f}  "
            f"{r['rel_err']['xla']:.1e}, {r['rel_err']['fallback']:.1e}",
            flush=True,
        )
    payload = {"device": common.device_name(), "jax_version": jax.__version__, "rows": rows}
    common.write_results(common.results_dir(args.out), "fallback_bf16", payload, plot)


if __name__ == "__main__":
    main()
