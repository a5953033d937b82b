"""Every compiled bf16 row x schedule x raster x swizzle at the short-K GEMMs of
the 2048x2048 dense layer (2048x8192x2048, kn and mn), against XLA's dot;
CUPTI device time, rotated inputs, fp32-checked, interleaved rounds.

    python benchmarks/investigations/explore_short_k.py --out benchmarks/results/h200/investigations \
        [--shape 2048x8192x2048]

Writes short_k_candidates.json and .png (the fastest candidates per layout).
The rows it can time are the compiled ones: build candidate rows with the
VARIANTS regex of scripts/gpu_check.sh to try rows outside the menu.
"""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
import statistics
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import common  # noqa: E402

from jax_cluster.planning import tables  # noqa: E402
from jax_cluster.planning.dense import plan_gemm  # noqa: E402
from jax_cluster.primitives.gemm import gemm  # noqa: E402
from jax_cluster.tuning import autotuner, timing  # noqa: E402
from jax_cluster.tuning.accuracy import TOLERANCE, reference, relative_error  # noqa: E402


def candidates(m, n, k, a_major, b_major):
    """autotune's candidates (the planner's own filter) but XLA, split-K and
    swap-AB rows, each at every swizzle: (overrides, plan) pairs."""
    swapped = {v.name for v in tables.load_menu() if v.swap_ab}
    found = []
    for base in autotuner.candidates(m, n, k, dtype=jnp.bfloat16, a_major=a_major, b_major=b_major):
        if base.get("path") == "xla" or base["schedule"] == "split_k" or base["variant"] in swapped:
            continue
        for swizzle in (1, 2, 4, 8):
            pinned = {**base, "swizzle": swizzle}
            try:
                plan = plan_gemm(m, n, k, dtype=jnp.bfloat16, a_major=a_major, b_major=b_major, **pinned)
            except ValueError:  # a swizzle this row's scheduler does not take
                continue
            if plan.uses_kernel:
                found.append((pinned, plan))
    return found


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="2048x8192x2048")
    parser.add_argument("--layouts", default="kn,mn")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--top", type=int, default=14)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args()
    m, n, k = map(int, args.shape.split("x"))
    rows = []
    for layout in args.layouts.split(","):
        a_major, b_major = layout
        key = jax.random.key(int.from_bytes(os.urandom(4), "little"))
        ops = autotuner._operands(key, m, n, k, 1, jnp.bfloat16, jnp.bfloat16, a_major, b_major, jax.devices()[0])
        ref = reference(*ops[0], a_major, b_major)
        fns = {"XLA dot": _reference_bf16(a_major, b_major)}
        for pinned, plan in candidates(m, n, k, a_major, b_major):
            fn = functools.partial(gemm, a_major=a_major, b_major=b_major, out_dtype=np.dtype(jnp.bfloat16), plan=plan)
            err = float(relative_error(jax.jit(fn)(*ops[0]), ref))
            label = (
                f"{pinned['variant'].split('bf16_bf16_')[1]} {pinned['schedule']} "
                f"{pinned['raster']} sw{pinned['swizzle']}"
            )
            if not err <= TOLERANCE["bf16"]:
                print(f"{layout} {label}: WRONG, relative error {err:.1e}", flush=True)
                continue
            fns[label] = fn
        times = {label: [] for label in fns}
        for r in range(args.rounds):
            order = list(fns) if r % 2 == 0 else list(fns)[::-1]
            for label in order:
                times[label].append(timing.cupti_ms(fns[label], ops, 10))
        med = sorted((statistics.median(t), label) for label, t in times.items())
        xla = statistics.median(times["XLA dot"])
        print(f"{layout} {m}x{n}x{k}: XLA {xla:.4f} ms; {len(fns) - 1} kernel candidates", flush=True)
        for ms, label in med[: args.top]:
            print(f"   {ms:.4f}  {2 * m * n * k / ms / 1e9:5.0f} TF/s  {ms / xla:5.3f}x XLA  {label}")
        rows += [{"layout": layout, "label": label, "ms": ms, "rounds": times[label]} for ms, label in med]
    if args.out:
        payload = {
            "device": common.device_name(),
            "jax_version": jax.__version__,
            "shape": [m, n, k],
            "rounds": args.rounds,
            "rows": rows,
            "notes": [
                "ms: median of interleaved rounds, CUPTI, 10 iterations over rotated inputs",
                "label: row, schedule, raster, swizzle",
            ],
        }
        common.write_results(args.out, "short_k_candidates", payload, plot)


def plot(payload, path, top=8):
    """Per layout, the fastest candidates' TF/s against XLA's dot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m, n, k = payload["shape"]
    layouts = list(dict.fromkeys(r["layout"] for r in payload["rows"]))
    fig, axes = plt.subplots(1, len(layouts), figsize=(7 * len(layouts), 5), squeeze=False)
    for ax, layout in zip(axes[0], layouts):
        rows = [r for r in payload["rows"] if r["layout"] == layout]
        xla = next(r["ms"] for r in rows if r["label"] == "XLA dot")
        shown = [r for r in rows if r["label"] != "XLA dot"][:top]
        tflops = [2 * m * n * k / r["ms"] / 1e9 for r in shown]
        ax.barh(range(len(shown)), tflops, color="tab:orange")
        ax.axvline(2 * m * n * k / xla / 1e9, color="tab:blue", label=f"XLA dot ({xla:.4f} ms)")
        ax.set_yticks(range(len(shown)), [f"{r['label']} ({r['ms'] / xla:.3f}x XLA time)" for r in shown], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlim(min(tflops) * 0.97, max(max(tflops), 2 * m * n * k / xla / 1e9) * 1.01)
        ax.set_xlabel("TF/s")
        ax.set_title(f"{layout} {m}x{n}x{k} bf16, {payload['device']}", fontsize=9)
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _reference_bf16(a_major, b_major):
    def xla(a, b):
        a2 = a if a_major == "k" else a.T
        b2 = b.T if b_major == "k" else b
        return a2 @ b2

    return xla


if __name__ == "__main__":
    main()
