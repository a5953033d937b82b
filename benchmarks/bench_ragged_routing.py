"""Grouped products on the grouped kernel and on XLA's ragged_dot, side by
side: the evidence for routing small grouped products to XLA.

Each row is one grouped product of an MoE layer's training step: the forward
(ragged_m, weights [G,K,N]), the input gradient (ragged_m, the same weights
read k-major) or the weight gradient (ragged_k), with the rows spread evenly
over the groups. Both sides run through jax_cluster's primitive: pinned to the
grouped kernel the planner picks (route="kernel"), and on XLA's path
(lax.ragged_dot_general); device time from CUPTI, inputs rotated past L2, the
two sides interleaved, each checked against a float32 product. `jc_ms` is
what a default call runs under the rule in planning/routing.json, `path`
which side that is. The layers come in two
families: the rule is fitted on one (`--fit`) and checked on the other.

    python benchmarks/bench_ragged_routing.py [--out DIR] [--rows fit|held_out|all]
    python benchmarks/bench_ragged_routing.py --fit results/h200/ragged_routing.json
Writes ragged_routing.json and .png.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import pathlib
import statistics
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import common  # noqa: E402

from jax_cluster.planning import routing  # noqa: E402
from jax_cluster.planning.device import describe  # noqa: E402
from jax_cluster.planning.grouped import plan_ragged  # noqa: E402
from jax_cluster.primitives.lowering import xla_ragged  # noqa: E402
from jax_cluster.primitives.ragged import ragged, ragged_call  # noqa: E402
from jax_cluster.tuning import timing  # noqa: E402
from jax_cluster.tuning.accuracy import relative_error  # noqa: E402

# (groups, rows, model width K, expert width N); rows are tokens x top_k
FIT = [
    (g, m, k, n)
    for g, m, (k, n) in itertools.product((4, 32), (64, 512, 4096), ((64, 128), (256, 512), (1024, 1024), (2048, 768)))
]
# other group counts, token counts and widths, and three decode-size layers
HELD_OUT = [(g, m, k, n) for g, m, (k, n) in itertools.product((2, 16), (256, 2048), ((128, 256), (512, 1408)))] + [
    (8, 8, 2048, 768),
    (8, 8, 4096, 14336),
    (16, 64, 2048, 1408),
    (64, 2048, 4096, 1536),
]
PRODUCTS = ("forward", "input_grad", "weight_grad")


def operands(key, product, g, m, k, n, dtype):
    """(a, b, problem, b_major) of one product; b is the [G,K,N] weights for
    the ragged_m products, the output gradient [M,N] for the weight gradient."""
    ka, kb = jax.random.split(key)
    if product == "forward":
        return common.randn(ka, (m, k), dtype), common.randn(kb, (g, k, n), dtype), "ragged_m", "n"
    if product == "input_grad":  # dx = dy . W_g^T: [G,K,N] read as [G, N', K'] with K' = N
        return common.randn(ka, (m, n), dtype), common.randn(kb, (g, k, n), dtype), "ragged_m", "k"
    return common.randn(ka, (m, k), dtype), common.randn(kb, (m, n), dtype), "ragged_k", "n"


def even_sizes(m, g):
    sizes = np.full(g, m // g, np.int32)
    sizes[: m % g] += 1
    return jnp.asarray(sizes)


def measure(row, dtype, iterations, rounds):
    g, m, k, n, product = row["groups"], row["rows"], row["k"], row["n"], row["product"]
    sizes = even_sizes(m, g)
    a, b, problem, b_major = operands(jax.random.key(g * 7919 + m * 31 + k + n), product, g, m, k, n, dtype)
    sets = timing.rotation(a.nbytes + b.nbytes)
    pairs = [(a, b)] + [
        operands(jax.random.key(s), product, g, m, k, n, dtype)[:2] for s in range(1, sets)
    ]  # fresh data per set, past L2
    call = ragged_call(a.shape, b.shape, sizes.shape, problem, b_major, a.dtype, a.dtype)
    dev = describe(jax.devices()[0])
    view = dict(problem=problem, dtype=call.dtype, out_dtype=call.out_dtype, b_major=b_major, device=dev)
    kernel = plan_ragged(call.m, call.n, call.k, call.count, route="kernel", **view)
    xla = plan_ragged(call.m, call.n, call.k, call.count, path="xla", **view)
    default = plan_ragged(call.m, call.n, call.k, call.count, **view)
    fns = {
        side: jax.jit(lambda a, b, plan=plan: ragged(a, b, sizes, problem=problem, b_major=b_major, plan=plan))
        for side, plan in (("kernel", kernel), ("xla", xla))
    }
    with jax.default_matmul_precision("highest"):  # the float32 reference, no TF32
        a32, b32 = a.astype(jnp.float32), b.astype(jnp.float32)
        want = xla_ragged(a32, b32, sizes, problem=problem, b_major=b_major, out_dtype=jnp.float32, plan=None)
    errors = {f"rel_err_{side}_vs_f32": float(relative_error(fn(a, b), want)) for side, fn in fns.items()}
    args = [(x, y) for x, y in pairs]
    times = {side: [] for side in fns}
    for r in range(rounds):
        for side in list(fns)[:: -1 if r % 2 else 1]:
            times[side].append(timing.cupti_ms(fns[side], args, iterations))
    row.update(
        problem=problem,
        b_major=b_major,
        variant=kernel.variant,
        kernel_ms=statistics.median(times["kernel"]),
        xla_ms=statistics.median(times["xla"]),
        **errors,
        expansion_us=routing.expansion_seconds(call, dev) * 1e6,
        path="xla" if default.path == "xla" else "kernel",
    )
    row["jc_ms"] = row["xla_ms"] if row["path"] == "xla" else row["kernel_ms"]
    return row


def rows_of(which):
    shapes = {"fit": FIT, "held_out": HELD_OUT, "all": FIT + HELD_OUT}[which]
    held = set(HELD_OUT)
    return [
        {"groups": g, "rows": m, "k": k, "n": n, "product": p, "held_out": (g, m, k, n) in held}
        for (g, m, k, n) in shapes
        for p in PRODUCTS
    ]


def routed_ms(row, threshold_us):
    return row["xla_ms"] if row["expansion_us"] < threshold_us else row["kernel_ms"]


def geomean(values):
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def fit(rows):
    """The threshold (us of modelled expansion) that makes the fitting rows'
    default calls fastest against XLA's path: the geometric mean of
    xla_ms / routed_ms, then the worst row, decide."""
    fitting = [r for r in rows if not r["held_out"]]
    candidates = sorted({0.0} | {r["expansion_us"] * f for r in fitting for f in (0.999, 1.001)})

    def score(t):
        ratios = [r["xla_ms"] / routed_ms(r, t) for r in fitting]
        return geomean(ratios), min(ratios)

    top = max(score(t) for t in candidates)
    tied = [t for t in candidates if score(t) == top]
    # the geometric middle of the best-scoring thresholds, away from the rows on either side
    best = math.sqrt(tied[0] * tied[-1]) if tied[0] > 0 else tied[0]
    if score(best) != top:  # the best thresholds are not one interval
        best = tied[0]
    return best, score(best)


def apply(payload, threshold_us):
    """Each row's default path and time under `threshold_us` (both sides were
    measured in the run, so this needs no GPU), and the summary."""
    payload["threshold_us"] = threshold_us
    for r in payload["rows"]:
        r["path"] = "xla" if r["expansion_us"] < threshold_us else "kernel"
        r["jc_ms"] = routed_ms(r, threshold_us)
    payload["summary"] = summary(payload["rows"])


def summary(rows):
    held = [r for r in rows if r["held_out"]]
    return {
        "geomean_speedup_vs_xla": geomean(r["xla_ms"] / r["jc_ms"] for r in rows),
        "geomean_speedup_vs_xla_held_out": geomean(r["xla_ms"] / r["jc_ms"] for r in held),
        "min_speedup_vs_xla_held_out": min((r["xla_ms"] / r["jc_ms"] for r in held), default=None),
        "geomean_kernel_everywhere_vs_xla": geomean(r["xla_ms"] / r["kernel_ms"] for r in rows),
        "xla_rows": sum(r["path"] == "xla" for r in rows),
        "rows": len(rows),
        "held_out_rows": len(held),
    }


def plot(payload, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = payload["rows"]
    fig, ax = plt.subplots(figsize=(11, 5.5))
    for held, marker in ((False, "o"), (True, "^")):
        pts = [(r["expansion_us"], r["xla_ms"] / r["kernel_ms"]) for r in rows if r["held_out"] == held]
        if pts:
            what = "held out" if held else "fitting"
            ax.scatter(*zip(*pts), s=20, marker=marker, label=f"grouped kernel over XLA ({what})")
    threshold = payload.get("threshold_us")
    if threshold:
        ax.axvline(threshold, c="tab:red", lw=0.8, ls="--", label=f"XLA below {threshold:.3g} us (routing.json)")
    ax.axhline(1.0, c="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("modelled time of XLA's dense expansion (us)")
    ax.set_ylabel("speedup of the grouped kernel over XLA's ragged_dot (device time)")
    ax.set_title(f"grouped products, bf16, {payload['device']}, commit {payload['commit']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_out_argument(parser)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rows", choices=("fit", "held_out", "all"), default="all")
    parser.add_argument("--fit", type=pathlib.Path, help="fit the threshold on a results file's fitting rows; no GPU")
    args = parser.parse_args()
    if args.fit:
        payload = json.loads(args.fit.read_text())
        threshold, (gm, worst) = fit(payload["rows"])
        print(f"threshold {threshold:.4g} us: fitting geomean {gm:.3f}, worst {worst:.3f}")
        apply(payload, round(threshold, 2))
        print(json.dumps(payload["summary"], indent=1))
        args.fit.write_text(json.dumps(payload, indent=1))
        plot(payload, args.fit.with_suffix(".png"))
        print("rewrote", args.fit, "with each row's default path under that threshold")
        return
    out = common.results_dir(args.out)
    done = []
    for row in rows_of(args.rows):
        row = measure(row, jnp.bfloat16, args.iterations, args.rounds)
        done.append(row)
        print(
            f"G={row['groups']:<3} M={row['rows']:<5} K={row['k']:<5} N={row['n']:<6} {row['product']:<11} "
            f"kernel {row['kernel_ms'] * 1e3:8.2f} us  XLA {row['xla_ms'] * 1e3:8.2f} us  "
            f"({row['xla_ms'] / row['kernel_ms']:.2f}x)  expansion {row['expansion_us']:.3g} us  default {row['path']}"
            f"{'  held out' if row['held_out'] else ''}  err vs f32 {row['rel_err_kernel_vs_f32']:.1e} "
            f"(XLA {row['rel_err_xla_vs_f32']:.1e})",
            flush=True,
        )
    record = common.run_record()
    entry = routing.rules_for(describe(jax.devices()[0]))
    payload = {
        "device": common.device_name(),
        "jax_version": jax.__version__,
        "commit": record["commit"],
        "threshold_us": round(entry.grouped.xla_below_seconds * 1e6, 6) if entry and entry.grouped else None,
        "summary": summary(done),
        "rows": done,
    }
    common.write_results(out, "ragged_routing", payload, plot)
    print(json.dumps(payload["summary"], indent=1))


if __name__ == "__main__":
    main()
