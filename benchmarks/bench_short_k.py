"""Products with a one- or few-element contraction: XLA's dot, the kernel the
planner picks (route="kernel"), XLA's dot with K padded to 2
(`primitives.lowering.xla_gemm_padded_k`, at K = 1) and what a default
jax_cluster call runs.

Such products write M x N outputs from M x K and K x N inputs, so their floor
is the HBM time of the output. The shapes are the weight gradients of one or
a few tokens of real layers (mn: dW = x^T dy) and an outer product of two
vectors (kn, K = 1).

Device time from CUPTI, inputs rotated past L2, every contender timed in each
of several interleaved rounds, in reversed order every other round (median),
all in one process.

    python benchmarks/bench_short_k.py --out benchmarks/results/h200/investigations
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import common  # noqa: E402
from bench_dense_suite import MAJORS, dimension_numbers, interleaved_ms, operands  # noqa: E402

import jax_cluster  # noqa: E402
from jax_cluster.planning import cost_model  # noqa: E402
from jax_cluster.planning.device import describe  # noqa: E402
from jax_cluster.primitives.gemm import gemm  # noqa: E402
from jax_cluster.primitives.lowering import xla_gemm_padded_k  # noqa: E402
from jax_cluster.tuning.accuracy import relative_error  # noqa: E402

# (label, M, N, layout) and the contraction lengths timed for each
SHAPES = [
    ("llama3-8b lm_head dW", 4096, 128256, "mn"),
    ("llama3-70b up dW", 8192, 28672, "mn"),
    ("deepseek-v3 o dW", 16384, 7168, "mn"),
    ("llama3-8b qkv dW", 4096, 6144, "mn"),
    ("mixtral o dW", 4096, 4096, "mn"),
    ("qwen2.5-7b qkv dW", 3584, 4608, "mn"),
    ("outer product", 8192, 8192, "kn"),
]
KS = (1, 2, 16)


def measure(label, m, n, k, layout, dtype, iterations, rounds):
    a_major, b_major = MAJORS[layout]
    args = operands(jax.random.key(m + 7 * n + 31 * k), m, n, k, layout, dtype)
    dims = dimension_numbers(layout)
    plan = jax_cluster.plan(m, n, k, dtype=dtype, a_major=a_major, b_major=b_major, route="kernel")
    sides = {
        "xla": lambda a, b: jax.lax.dot_general(a, b, dims, preferred_element_type=dtype),
        "jax_cluster": lambda a, b: jax_cluster.dot_general(a, b, dims),
    }
    if k == 1:
        sides["padded"] = lambda a, b: xla_gemm_padded_k(
            a, b, a_major=a_major, b_major=b_major, out_dtype=dtype, plan=None
        )
    if plan.uses_kernel:
        sides["kernel"] = lambda a, b: gemm(a, b, a_major=a_major, b_major=b_major, plan=plan)
    a32, b32 = (x.astype(jnp.float32) for x in args[0])
    want = jax.lax.dot_general(a32, b32, dims, precision=jax.lax.Precision.HIGHEST)
    errors = {side: float(relative_error(jax.jit(fn)(*args[0]), want)) for side, fn in sides.items()}
    ms = interleaved_ms(sides, args, iterations, rounds)
    dev = describe()
    edge = cost_model.ridge(dev, "bf16")
    moved = cost_model.bytes_moved(m, n, k, 1, 2, 2)
    return {
        "label": label,
        "m": m,
        "n": n,
        "k": k,
        "layout": layout,
        "xla_ms": ms["xla"],
        "jc_ms": ms["jax_cluster"],
        "padded_ms": ms.get("padded"),
        "kernel_ms": ms.get("kernel"),
        "jc_path": jax_cluster.plan(m, n, k, dtype=dtype, a_major=a_major, b_major=b_major).path,
        "kernel_variant": plan.variant if plan.uses_kernel else None,
        "kernel_reason": None if plan.uses_kernel else plan.reason,
        "hbm_floor_ms": moved / edge[2] * 1e3 if edge else None,
        "rel_err": errors,
    }


def plot(payload, path):
    rows = payload["rows"]
    labels = [f"{r['label']} K={r['k']}" for r in rows]
    common.plot_pairs(
        path,
        labels,
        [r["xla_ms"] * 1e3 for r in rows],
        [r["jc_ms"] * 1e3 for r in rows],
        baseline_label="XLA's dot",
        ours_label="jax_cluster (default call)",
        ratios=[r["xla_ms"] / r["jc_ms"] for r in rows],
        ylabel="device time (us)",
        title=f"short-K products, bf16, {payload['device']}, commit {payload['commit']}",
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_out_argument(parser)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ks", default=",".join(map(str, KS)), help="comma-separated contraction lengths")
    args = parser.parse_args()
    rows = []
    for label, m, n, layout in SHAPES:
        for k in (int(x) for x in args.ks.split(",")):
            r = measure(label, m, n, k, layout, jnp.bfloat16, args.iterations, args.rounds)
            rows.append(r)
            kernel = f"{r['kernel_ms'] * 1e3:8.1f}" if r["kernel_ms"] else "       -"
            padded = f"{r['padded_ms'] * 1e3:8.1f}" if r["padded_ms"] else "       -"
            print(
                f"{label:<22} K={k:<3} {layout} floor {r['hbm_floor_ms'] * 1e3:7.1f} us  XLA {r['xla_ms'] * 1e3:8.1f}"
                f"  padded {padded}  kernel {kernel}  jax_cluster {r['jc_ms'] * 1e3:8.1f} ({r['jc_path']}, "
                f"{r['xla_ms'] / r['jc_ms']:.2f}x)",
                flush=True,
            )
    record = common.run_record()
    payload = {"device": common.device_name(), "jax_version": jax.__version__, "commit": record["commit"], "rows": rows}
    common.write_results(common.results_dir(args.out), "short_k", payload, plot)


if __name__ == "__main__":
    main()
