"""Where does the MoE MLP's forward + backward spend its device time, in bf16
and in the blockwise fp8 recipe? For each configuration named (skewed
routing, as bench_moe_mlp.py draws it), both layers on the same weights in
one process: the step's device time (CUPTI) and its kernels, longest first,
each with its share of the step, plus the totals of three kinds of kernel:
GEMMs (jax_cluster's, with their preparation kernels and decode rows, or
cuBLAS's), the token-tile quantization kernel, and everything else: XLA's
fusions and copies, where the rest of the on-the-fly quantization runs.

    python benchmarks/investigations/diag_fp8_moe.py [--configs deepseek-v3,mixtral-8x22b] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import jax

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_moe_mlp as moe  # noqa: E402
import common  # noqa: E402

import jax_cluster  # noqa: E402
from jax_cluster.tuning import timing  # noqa: E402

KINDS = {  # substrings of kernel names, checked in this order
    "token_tiles": ("quantize_token_tiles",),
    "gemms": ("device_kernel", "gemm", "ragged_decode", "prepare_ragged_groups"),
    "other": ("",),
}


def kind_of(name: str) -> str:
    return next(kind for kind, marks in KINDS.items() if any(m in name.lower() for m in marks))


def breakdown(step, args, iterations):
    ms, kernels = timing.cupti_kernels(step, args, iterations)
    totals = dict.fromkeys(KINDS, 0.0)
    for name, k_ms in kernels:
        totals[kind_of(name)] += k_ms
    # whole names: the grouped GEMMs differ only in template arguments deep in theirs
    top = [{"kernel": name, "ms": k_ms, "share": k_ms / ms} for name, k_ms in kernels[:15]]
    return {"ms": ms, "kinds_ms": totals, "kernels": len(kernels), "top": top}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="deepseek-v3,mixtral-8x22b")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args(argv)
    by_name = {c.name: c for c in moe.CONFIGS + moe.SMOKE}
    report = {"device": common.device_name(), "jax_version": jax.__version__, "rows": []}
    for name in args.configs.split(","):
        cfg = by_name[name]
        _, routed, (x, dy) = moe.case_inputs(cfg, moe.TRAINING_TOKENS, "skewed")
        graph, state = moe.make_layer(cfg, jax_cluster.ragged_dot, abstract=False)
        step_args = [(state, x, dy, *routed)]
        row = {"config": name, "routing": "skewed", "tokens": moe.TRAINING_TOKENS}
        for recipe in ("bf16", "blockwise"):
            fp8 = None if recipe == "bf16" else recipe
            layer = graph if fp8 is None else moe.make_layer(cfg, jax_cluster.ragged_dot, abstract=True, fp8=fp8)[0]
            row[recipe] = breakdown(moe.step_fn(layer), step_args, args.iterations)
            found = row[recipe]
            kinds = ", ".join(f"{k} {v:.2f}" for k, v in found["kinds_ms"].items())
            print(f"{name} {recipe}: {found['ms']:.2f} ms in {found['kernels']} kernels ({kinds})", flush=True)
            for k in found["top"]:
                print(f"    {k['ms']:8.3f} ms {k['share']:6.1%}  {k['kernel'][:100]}")
            moe.release_memory()
        report["rows"].append(row)
        if args.out:  # after every configuration: a run cut off keeps what it measured
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "fp8_moe_breakdown.json").write_text(json.dumps(report, indent=1) + "\n")
        del state, step_args
        moe.release_memory()


if __name__ == "__main__":
    main()
