"""Grouped products on the CPU: jax_cluster's tiled lowering against XLA's
`lax.ragged_dot` (its expansion into one dense product per group), in one
process, wall time of a jitted call after its first (compiling) call, best
of `--repeats`. Forward (ragged_m) and weight gradient (ragged_k), bf16 in.

    python benchmarks/bench_ragged_cpu.py    # writes benchmarks/results/cpu/ragged_cpu.{json,png}
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
from jax import lax

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import common  # noqa: E402

import jax_cluster  # noqa: E402
from jax_cluster.primitives.ragged import ragged  # noqa: E402

# (rows, groups, K, N)
CASES = [(2048, 8, 4096, 1792), (1024, 128, 2048, 768)]
_RAGGED_K = lax.RaggedDotDimensionNumbers((((0,), (0,)), ((), ())), lhs_ragged_dimensions=[0], rhs_group_dimensions=[])


def best_seconds(fn, args, repeats):
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return min(times)


def products(rows, groups, k, n):
    ka, kb, kc = jax.random.split(jax.random.key(rows * groups), 3)
    a = jax.random.normal(ka, (rows, k), jnp.bfloat16)
    b = jax.random.normal(kb, (groups, k, n), jnp.bfloat16)
    dy = jax.random.normal(kc, (rows, n), jnp.bfloat16)
    sizes = jnp.full((groups,), rows // groups, jnp.int32)
    yield "forward", (a, b, sizes), jax_cluster.ragged_dot, lax.ragged_dot
    yield (
        "weight gradient",
        (a, dy, sizes),
        lambda x, y, s: ragged(x, y, s, problem="ragged_k"),
        lambda x, y, s: lax.ragged_dot_general(x, y, s, _RAGGED_K).astype(x.dtype),
    )


def plot(payload, path):
    rows = payload["rows"]
    labels = [f"{r['rows']}x{r['groups']}x{r['k']}x{r['n']}\n{r['product']}" for r in rows]
    common.plot_pairs(
        path,
        labels,
        [r["xla_s"] for r in rows],
        [r["jc_s"] for r in rows],
        baseline_label="lax.ragged_dot (XLA)",
        ratios=[r["speedup"] for r in rows],
        ylabel="seconds (wall, best of repeats)",
        title="Grouped products on the CPU",
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    common.add_out_argument(parser)
    args = parser.parse_args()
    rows = []
    for case in CASES:
        for product, operands, ours, xla in products(*case):
            ref = jax.jit(xla)(*operands).astype(jnp.float32)
            got = jax.jit(ours)(*operands).astype(jnp.float32)
            err = float(jnp.linalg.norm(got - ref) / jnp.linalg.norm(ref))
            jc_s = best_seconds(jax.jit(ours), operands, args.repeats)
            xla_s = best_seconds(jax.jit(xla), operands, args.repeats)
            row = dict(zip(("rows", "groups", "k", "n"), case), product=product, jc_s=jc_s, xla_s=xla_s)
            row.update(speedup=xla_s / jc_s, rel_err_vs_xla=err)
            rows.append(row)
            print(row, flush=True)
    payload = {"device": common.device_name(), "jax_version": jax.__version__, "timing": "wall", "rows": rows}
    common.write_results(common.results_dir(args.out), "ragged_cpu", payload, plot)


if __name__ == "__main__":
    main()
