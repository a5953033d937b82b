"""The dense suite: GEMMs of real model layers, jax_cluster against XLA's dot.

Each layer y = x·W (x [T, D_in], W [D_in, D_out]) gives three GEMMs: the
forward (kn: M=T, N=D_out, K=D_in), the input gradient (kk: dx = dy·Wᵀ,
M=T, N=D_in, K=D_out, W read in place) and the weight gradient (mn:
dW = xᵀ·dy, M=D_in, N=D_out, K=T, x read in place). Token counts run from 1
(decode) to 65536. Whole model families are held out: a routing rule fitted
on the rest is reported on them (`held_out`), never on the shapes it saw.

Device time from CUPTI, inputs rotated past L2, both sides in one process,
timed in interleaved rounds (median of each).
Writes dense_suite.json ({"device", "jax_version", "commit", "rows": [{"model",
"m", "n", "k", "layout", "xla_ms", "jc_ms", "path", "held_out"}]}) and a PNG;
--part I/N runs every Nth row (from I) and --merge keeps the rows of earlier
parts, so the suite fits into several shorter runs.

    python benchmarks/bench_dense_suite.py --list          # the rows, no GPU
    python benchmarks/bench_dense_suite.py --part 0/2 && python benchmarks/bench_dense_suite.py --part 1/2 --merge
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import statistics
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import common  # noqa: E402

import jax_cluster  # noqa: E402
from jax_cluster.planning import tables  # noqa: E402
from jax_cluster.primitives.gemm import gemm  # noqa: E402
from jax_cluster.tuning import timing  # noqa: E402
from jax_cluster.tuning.accuracy import relative_error  # noqa: E402

# (model, layer, D_in, D_out, token counts): published configurations
LAYERS = [
    ("llama3-8b", "qkv", 4096, 6144, (1, 2048, 8192)),
    ("llama3-8b", "o", 4096, 4096, (16, 4096)),
    ("llama3-8b", "gate_up", 4096, 28672, (128, 8192)),
    ("llama3-8b", "down", 14336, 4096, (512, 16384)),
    ("llama3-8b", "lm_head", 4096, 128256, (1, 4096)),
    ("llama3-70b", "qkv", 8192, 10240, (16, 4096)),
    ("llama3-70b", "o", 8192, 8192, (2048, 8192)),
    ("llama3-70b", "up", 8192, 28672, (1, 4096)),
    ("llama3-70b", "down", 28672, 8192, (256, 8192)),
    ("llama3-70b", "lm_head", 8192, 128256, (16, 2048)),
    ("mixtral-8x7b", "qkv", 4096, 6144, (4096, 65536)),
    ("mixtral-8x7b", "o", 4096, 4096, (1, 16384)),
    ("mixtral-8x7b", "lm_head", 4096, 32000, (512, 8192)),
    ("gpt-neox-20b", "qkv", 6144, 18432, (2048, 8192)),
    ("gpt-neox-20b", "mlp_in", 6144, 24576, (16, 4096)),
    ("gpt-neox-20b", "mlp_out", 24576, 6144, (1024, 8192)),
    ("gpt2-medium", "mlp_in", 1024, 4096, (1024, 16384)),
    ("gpt2-medium", "lm_head", 1024, 50304, (128, 8192)),
    # held out below: these families never inform a fitted rule
    ("qwen2.5-7b", "qkv", 3584, 4608, (1, 4096)),
    ("qwen2.5-7b", "up", 3584, 18944, (256, 8192)),
    ("qwen2.5-7b", "down", 18944, 3584, (16, 16384)),
    ("qwen2.5-7b", "lm_head", 3584, 152064, (2048,)),
    ("deepseek-v3", "q_a", 7168, 1536, (4096, 16384)),
    ("deepseek-v3", "o", 16384, 7168, (1, 8192)),
    ("deepseek-v3", "mlp_up", 7168, 18432, (512, 4096)),
    ("deepseek-v3", "mlp_down", 18432, 7168, (2048,)),
    ("deepseek-v3", "lm_head", 7168, 129280, (16, 4096)),
    ("vit-l16", "qkv", 1024, 3072, (50432,)),
    ("vit-l16", "mlp_in", 1024, 4096, (12608, 50432)),
    ("vit-h14", "mlp_out", 5120, 1280, (16448, 65536)),
]
HELD_OUT = {"qwen2.5-7b", "deepseek-v3", "vit-l16", "vit-h14"}
LAYOUTS = ("kn", "kk", "mn")
# (a_major, b_major) of each layout, and its (M, N, K) from (T, D_in, D_out)
MAJORS = {"kn": ("k", "n"), "kk": ("k", "k"), "mn": ("m", "n")}


def gemm_of(layout, tokens, d_in, d_out):
    return {"kn": (tokens, d_out, d_in), "kk": (tokens, d_in, d_out), "mn": (d_in, d_out, tokens)}[layout]


def suite():
    rows = []
    for model, layer, d_in, d_out, token_counts in LAYERS:
        for tokens in token_counts:
            for layout in LAYOUTS:
                m, n, k = gemm_of(layout, tokens, d_in, d_out)
                rows.append(
                    dict(
                        model=model,
                        layer=layer,
                        tokens=tokens,
                        m=m,
                        n=n,
                        k=k,
                        layout=layout,
                        held_out=model in HELD_OUT,
                    )
                )
    return rows


def operands(key, m, n, k, layout, dtype):
    a_major, b_major = MAJORS[layout]
    a_shape = (m, k) if a_major == "k" else (k, m)
    b_shape = (n, k) if b_major == "k" else (k, n)
    sets = timing.rotation((m * k + k * n + m * n) * jnp.dtype(dtype).itemsize)
    keys = jax.random.split(key, 2 * sets)
    return [
        (common.randn(keys[2 * i], a_shape, dtype), common.randn(keys[2 * i + 1], b_shape, dtype)) for i in range(sets)
    ]


def dimension_numbers(layout):
    a_major, b_major = MAJORS[layout]
    return (((1 if a_major == "k" else 0,), (1 if b_major == "k" else 0,)), ((), ()))


def interleaved_ms(fns: dict, args, iterations: int, rounds: int) -> dict:
    """Median device time of each function over `rounds` rounds, each round
    timing every function once, in reversed order every other round: clocks
    that drift as the card heats over a run weigh on every side alike."""
    times = {name: [] for name in fns}
    for i in range(rounds):
        for name in list(fns)[:: -1 if i % 2 else 1]:
            times[name].append(timing.cupti_ms(fns[name], args, iterations))
    return {name: statistics.median(t) for name, t in times.items()}


def measure(row, dtype, iterations, both_paths, pinned=(), rounds=2):
    """XLA's dot, the kernel the planner picks before routing (`kernel_ms`,
    the evidence a routing rule is fitted on) and what a default call runs
    (`jc_ms`: the same kernel, or XLA's dot where the routing rule sends it),
    timed in `rounds` interleaved rounds (interleaved_ms).
    `both_paths` also times the call forced onto its XLA path (`routed_xla_ms`),
    so a rule fitted afterwards can be scored on paths measured in this run.
    `pinned` names menu rows to time as well, each on the rows of its layout
    (`pinned_ms`: {variant: ms}), to compare rows the planner may not take yet."""
    m, n, k, layout = row["m"], row["n"], row["k"], row["layout"]
    dims = dimension_numbers(layout)
    args = operands(jax.random.key(m * 7 + n * 3 + k), m, n, k, layout, dtype)
    a_major, b_major = MAJORS[layout]
    plan = jax_cluster.plan(m, n, k, dtype=dtype, a_major=a_major, b_major=b_major)
    kernel_plan = jax_cluster.plan(m, n, k, dtype=dtype, a_major=a_major, b_major=b_major, route="kernel")

    def ours(a, b):
        return jax_cluster.dot_general(a, b, dims)

    def kernel(a, b):
        return gemm(a, b, a_major=a_major, b_major=b_major, plan=kernel_plan)

    def xla(a, b):
        return jax.lax.dot_general(a, b, dims, preferred_element_type=dtype)

    def on_plan(p):  # a call on the given plan
        return lambda a, b: gemm(a, b, a_major=a_major, b_major=b_major, plan=p)

    want = jax.jit(xla)(*args[0]).astype(jnp.float32)
    err = float(relative_error(jax.jit(ours)(*args[0]), want))
    kernel_err = float(relative_error(jax.jit(kernel)(*args[0]), want))
    fns = {"xla": xla}
    if kernel_plan.uses_kernel:
        fns["kernel"] = kernel
    if both_paths:
        fns["routed_xla"] = on_plan(
            jax_cluster.plan(m, n, k, dtype=dtype, a_major=a_major, b_major=b_major, path="xla")
        )
    for name in pinned:
        fns[name] = on_plan(jax_cluster.plan(m, n, k, dtype=dtype, a_major=a_major, b_major=b_major, variant=name))
    same = plan.uses_kernel and plan.variant == kernel_plan.variant and plan.schedule == kernel_plan.schedule
    if not same and not (not plan.uses_kernel and both_paths):
        fns["ours"] = ours  # a call that is neither of the paths timed above
    ms = interleaved_ms(fns, args, iterations, rounds)
    kernel_ms, routed_xla_ms = ms.get("kernel"), ms.get("routed_xla")
    jc_ms = kernel_ms if same else routed_xla_ms if not plan.uses_kernel and both_paths else ms["ours"]
    return dict(
        row,
        xla_ms=ms["xla"],
        jc_ms=jc_ms,
        kernel_ms=kernel_ms,
        routed_xla_ms=routed_xla_ms,
        path=plan.path,
        variant=kernel_plan.variant,
        schedule=kernel_plan.schedule,
        waves=kernel_plan.waves,
        memory_bound=kernel_plan.memory_bound,
        predicted_efficiency=kernel_plan.predicted_efficiency,
        reason=plan.reason,
        rel_err_vs_xla=err,
        kernel_rel_err_vs_xla=kernel_err,
        rounds=rounds,
        **({"pinned_ms": {name: ms[name] for name in pinned}} if pinned else {}),
    )


def summary(rows):
    def geomean(rs, key="jc_ms"):
        rs = [r for r in rs if r.get(key)]
        return math.exp(sum(math.log(r["xla_ms"] / r[key]) for r in rs) / len(rs)) if rs else None

    held = [r for r in rows if r["held_out"]]
    return {
        "geomean_speedup": geomean(rows),
        "geomean_speedup_held_out": geomean(held),
        "min_speedup_held_out": min((r["xla_ms"] / r["jc_ms"] for r in held), default=None),
        "geomean_speedup_kernel_everywhere": geomean(rows, "kernel_ms"),
        "kernel_rows": sum(r["path"] == "kernel" for r in rows),
        "rows": len(rows),
        "held_out_rows": len(held),
    }


def plot(payload, path):
    """Speedup over XLA's dot against problem size: what a default call runs,
    and the kernel wherever it could run (the evidence routing acts on)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = payload["rows"]
    fig, ax = plt.subplots(figsize=(11, 5.5))
    flops = [math.log2(2.0 * r["m"] * r["n"] * r["k"]) for r in rows]
    kernel = [(f, r["xla_ms"] / r["kernel_ms"]) for f, r in zip(flops, rows) if r.get("kernel_ms")]
    ax.scatter(*zip(*kernel), s=14, c="0.7", label="kernel everywhere (route='kernel')")
    for held, marker in ((False, "o"), (True, "^")):
        for route, color in (("kernel", "tab:orange"), ("xla", "tab:blue")):
            pts = [
                (f, r["xla_ms"] / r["jc_ms"])
                for f, r in zip(flops, rows)
                if r["held_out"] == held and r["path"] == route
            ]
            if pts:
                what = "held out" if held else "fitting"
                ax.scatter(*zip(*pts), s=22, marker=marker, c=color, label=f"default call on {route} ({what})")
    ax.axhline(1.0, c="k", lw=0.8)
    ax.axhline(0.98, c="k", lw=0.6, ls=":")
    ax.set_xlabel("log2 FLOPs of the GEMM")
    ax.set_ylabel("speedup over XLA's dot (device time)")
    summary = payload.get("summary", {})
    ax.set_title(
        f"dense suite, bf16, {payload['device']}, commit {payload['commit']}: geomean "
        f"{summary.get('geomean_speedup', float('nan')):.3f}, held out min "
        f"{summary.get('min_speedup_held_out') or float('nan'):.3f}"
    )
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_out_argument(parser)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds per row (median)")
    parser.add_argument("--part", default="0/1", help="I/N: every Nth row of the suite, from row I")
    parser.add_argument("--merge", action="store_true", help="keep the rows of an earlier run in --out")
    parser.add_argument("--list", action="store_true", help="print the rows and exit (no GPU)")
    parser.add_argument("--rows", choices=("all", "fit", "held_out"), default="all", help="which families to run")
    parser.add_argument(
        "--both-paths", action="store_true", help="also time each call forced onto XLA's path (to fit a rule)"
    )
    parser.add_argument(
        "--pin",
        action="append",
        default=[],
        metavar="VARIANT",
        help="also time this menu row on the rows of its layout (repeatable); writes dense_suite_pinned.json",
    )
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="comma-separated layouts to run")
    parser.add_argument("--max-k", type=int, default=None, help="only rows with K at most this")
    args = parser.parse_args()
    first, count = (int(x) for x in args.part.split("/"))
    rows = [r for r in suite() if args.rows == "all" or r["held_out"] == (args.rows == "held_out")]
    layouts = set(args.layouts.split(","))
    rows = [r for r in rows if r["layout"] in layouts and (args.max_k is None or r["k"] <= args.max_k)]
    rows = rows[first::count]
    name = "dense_suite_pinned" if args.pin else "dense_suite"
    if args.list:
        for r in rows:
            print(
                f"{r['model']:<14} {r['layer']:<8} T={r['tokens']:<6} {r['layout']} M={r['m']} N={r['n']} "
                f"K={r['k']}{'  held out' if r['held_out'] else ''}"
            )
        print(f"{len(rows)} rows ({len(suite())} in the suite, {len(LAYERS)} layers)")
        return
    out = common.results_dir(args.out)
    done = {}
    if args.merge and (out / f"{name}.json").exists():
        for r in json.loads((out / f"{name}.json").read_text())["rows"]:
            done[(r["model"], r["layer"], r["tokens"], r["layout"])] = r
    menu = {v.name: v for v in tables.load_menu()}
    unknown = [p for p in args.pin if p not in menu]
    if unknown:
        parser.error(f"--pin: not in the menu: {', '.join(unknown)}")
    for r in rows:
        pins = [p for p in args.pin if (menu[p].a_major, menu[p].b_major) == MAJORS[r["layout"]]]
        r = measure(r, jnp.bfloat16, args.iterations, args.both_paths, pins, args.rounds)
        done[(r["model"], r["layer"], r["tokens"], r["layout"])] = r
        with open(out / f"{name}_rows.jsonl", "a") as f:  # kept should the run be cut short
            f.write(json.dumps(r) + "\n")
        print(
            f"{r['model']:<14} {r['layer']:<8} T={r['tokens']:<6} {r['layout']} XLA {r['xla_ms']:.4f} ms, "
            f"ours {r['jc_ms']:.4f} ms ({r['xla_ms'] / r['jc_ms']:.3f}x) {r['path']} "
            f"{'held out' if r['held_out'] else ''}"
            + "".join(f" | {v.rsplit('_', 1)[-1]} {ms:.4f} ms" for v, ms in r.get("pinned_ms", {}).items()),
            flush=True,
        )
    ordered = [
        done[key] for key in ((r["model"], r["layer"], r["tokens"], r["layout"]) for r in suite()) if key in done
    ]
    record = common.run_record()
    payload = {
        "device": common.device_name(),
        "jax_version": jax.__version__,
        "commit": record["commit"],
        "summary": summary(ordered),
        "rows": ordered,
    }
    common.write_results(out, name, payload, plot)
    print(json.dumps(payload["summary"], indent=1))


if __name__ == "__main__":
    main()
