"""Why do jax_cluster's GEMMs run longer inside the dense layer's step than
alone? Times, in one process, under the XLA_FLAGS it was started with:

  step: both sides' dense-layer steps, as the sum of kernel durations (CUPTI)
        and as the wall time of many back-to-back calls (the device's span,
        gaps and overlap included), interleaved rounds;
  gemm: the step's three GEMMs alone, ours (planner's choice) and XLA's,
        with rotated (cold) inputs and with one set of inputs (hot L2).

    python benchmarks/investigations/diag_step_overlap.py --out benchmarks/results/h200/investigations
Run it twice, once with XLA_FLAGS=--xla_gpu_enable_command_buffer= (written
as step_overlap_bf16_nocb.*), to see what XLA's command buffers change.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import bench_layers  # noqa: E402
import common  # noqa: E402

from jax_cluster.primitives.gemm import gemm  # noqa: E402
from jax_cluster.tuning import timing  # noqa: E402
from jax_cluster.tuning.accuracy import relative_error  # noqa: E402


def step_rows(t, d, rounds):
    (ours, ocall), (flaxs, fcall) = bench_layers.dense_pair(d)
    sides = {"jax_cluster": bench_layers.step_fn(ours, ocall), "flax": bench_layers.step_fn(flaxs, fcall)}
    param_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(sides["jax_cluster"][1]))
    sets = timing.rotation(t * d * 2 + param_bytes)
    keys = jax.random.split(jax.random.key(1), sets)
    inputs = [common.randn(k, (t, d), jnp.bfloat16) for k in keys]
    res = {side: {"sum": [], "span": []} for side in sides}
    kernels = {}
    for r in range(rounds):
        for side in list(sides) if r % 2 == 0 else list(sides)[::-1]:
            step, state = sides[side]
            fn = lambda s, x, step=step: step(s, x)  # noqa: E731
            args = [(state, x) for x in inputs]
            ms, ks = timing.cupti_kernels(fn, args, 10)
            res[side]["sum"].append(ms)
            res[side]["span"].append(timing.span_ms(fn, args))
            kernels[side] = ks
    row = {"shape": [t, d], "kernels": {side: kernels[side][:8] for side in sides}}
    for side in sides:
        s, w = statistics.median(res[side]["sum"]), statistics.median(res[side]["span"])
        row[side] = {"sum_ms": s, "span_ms": w, "rounds_sum": res[side]["sum"], "rounds_span": res[side]["span"]}
        print(
            f"step {t}x{d} {side:12s} sum {s:.4f} ms  span {w:.4f} ms  "
            f"rounds sum {[round(v, 4) for v in res[side]['sum']]} "
            f"span {[round(v, 4) for v in res[side]['span']]}",
            flush=True,
        )
        for name, ms in kernels[side][:8]:
            print(f"      {ms:.4f}  {name[-70:]}")
    ratio = {m: statistics.median(res["flax"][m]) / statistics.median(res["jax_cluster"][m]) for m in ("sum", "span")}
    print(f"step {t}x{d} flax/ours: sum {ratio['sum']:.3f}  span {ratio['span']:.3f}", flush=True)
    return row


def gemm_rows(t, d):
    n = 4 * d
    k1, k2 = jax.random.split(jax.random.key(2))
    cases = {
        "kn fwd": ((t, d), (d, n), lambda a, b: gemm(a, b, a_major="k", b_major="n"), lambda a, b: a @ b),
        "mn dW": ((t, d), (t, n), lambda a, b: gemm(a, b, a_major="m", b_major="n"), lambda a, b: a.T @ b),
        "kk dx": ((t, n), (d, n), lambda a, b: gemm(a, b, a_major="k", b_major="k"), lambda a, b: a @ b.T),
    }
    rows = []
    for label, (sa, sb, ours, xla) in cases.items():
        sets = timing.rotation(2 * (sa[0] * sa[1] + sb[0] * sb[1] + t * n))
        a = [common.randn(k, sa, jnp.bfloat16) for k in jax.random.split(k1, sets)]
        b = [common.randn(k, sb, jnp.bfloat16) for k in jax.random.split(k2, sets)]
        rot = list(zip(a, b))
        hot = [rot[0]] * sets
        line, row = [], {"gemm": label}
        got, want = (jnp.asarray(jax.jit(f)(*rot[0]), jnp.float32) for f in (ours, xla))
        row["rel_err_vs_xla"] = float(relative_error(got, want))
        for side, fn in (("ours", ours), ("xla", xla)):
            cold_ms = timing.cupti_ms(fn, rot, 10)
            hot_ms = timing.cupti_ms(fn, hot, 10)
            line.append(f"{side} cold {cold_ms:.4f} hot {hot_ms:.4f}")
            row[side] = {"cold_ms": cold_ms, "hot_ms": hot_ms}
        print(f"gemm {t}x{d} {label}: " + "  ".join(line) + f"  rel err vs XLA {row['rel_err_vs_xla']:.1e}", flush=True)
        rows.append(row)
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="2048x2048,8192x4096")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args()
    flags = os.environ.get("XLA_FLAGS", "").strip()
    print(f"XLA_FLAGS={flags!r} jax {jax.__version__}", flush=True)
    payload = {
        "device": common.device_name(),
        "jax_version": jax.__version__,
        "xla_flags": flags,
        "notes": [
            "sum_ms: kernel durations per step (CUPTI), median of interleaved rounds",
            "span_ms: wall time per step of 20 back-to-back rotated calls, synced once",
            "gemms: the step's GEMMs alone, rotated (cold) or one input set (hot)",
        ],
        "steps": [],
        "gemms": [],
    }
    for shape in args.shapes.split(","):
        t, d = map(int, shape.split("x"))
        payload["steps"].append(step_rows(t, d, args.rounds))
        payload["gemms"].append({"shape": [t, d], "rows": gemm_rows(t, d)})
        jax.clear_caches()
    if args.out:
        common.write_results(args.out, common.results_stem("step_overlap_bf16", flags), payload, plot)


def plot(payload, path):
    labels, flax, ours = [], [], []
    for row in payload["steps"]:
        for metric in ("sum_ms", "span_ms"):
            labels.append(f"{row['shape'][0]}x{row['shape'][1]} {metric[:-3]}")
            flax.append(row["flax"][metric])
            ours.append(row["jax_cluster"][metric])
    common.plot_pairs(
        path,
        labels,
        flax,
        ours,
        baseline_label="Flax",
        ratios=[f / o for f, o in zip(flax, ours)],
        ylabel="ms per step",
        title=f"Dense layer step: kernel sum and wall span, {payload['device']}, "
        f"XLA_FLAGS={payload['xla_flags'] or '(none)'}",
    )


if __name__ == "__main__":
    main()
