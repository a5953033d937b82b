"""Block-scaled fp8 grouped GEMMs (MoE expert products): jax_cluster's
grouped kernel against torch's row-wise scaled grouped GEMM, XLA's
`lax.ragged_dot` and jax_cluster's own bf16 `ragged_dot`, in one process.

jax_cluster ("jc"): the block-scaled grouped kernel (ragged_m) on rows [M,K]
in 1x128 tiles and each expert's weight [N,K] in 128x128 blocks, float32
scales (DeepSeek-V3's recipe), bf16 out, as the planner picks it. torch:
`torch._scaled_grouped_mm` with row-wise scales (one per row of A and per
output column of each expert), an outside reference only. XLA has no fp8
grouped GEMM: xla_bf16 is `lax.ragged_dot` on the bf16 operands, which
expands the groups densely and cannot run the largest layers (its error is
recorded). jc_bf16: `jax_cluster.ragged_dot` on the bf16 operands. Group
sizes are uniform, so every contender sees the same groups (torch wants
16-row multiples). The kernel's result is checked first against the float32
product of the dequantized operands, on sampled rows of the first, middle
and last group; a contender that cannot run a case records why. Device time:
CUPTI for JAX, CUDA events for torch; inputs rotate past L2. Writes
fp8_grouped.json (rows[] with the shape, jc_ms, torch_ms, xla_bf16_ms,
jc_bf16_ms and their ratios) and a PNG.

    python benchmarks/bench_fp8_grouped.py --out benchmarks/results/h200
    python benchmarks/bench_fp8_grouped.py --list
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import bench_fp8_dense  # noqa: E402
import bench_ragged  # noqa: E402
import common  # noqa: E402

import jax_cluster  # noqa: E402
from jax_cluster import _ffi  # noqa: E402
from jax_cluster.planning import tables  # noqa: E402
from jax_cluster.primitives.lowering import xla_scaled_ragged  # noqa: E402
from jax_cluster.primitives.scaled_ragged import scaled_ragged_dot  # noqa: E402
from jax_cluster.tools.selftest import scaled_grouped_operands  # noqa: E402
from jax_cluster.tuning import timing  # noqa: E402

E4M3 = jnp.float8_e4m3fn
TOKENS = 8192
# (model and product, rows = tokens x top_k, experts, K, N): forward expert products
SHAPES = [
    ("mixtral-8x7b gate", TOKENS * 2, 8, 4096, 14336),
    ("mixtral-8x7b down", TOKENS * 2, 8, 14336, 4096),
    ("deepseek-v3 gate", TOKENS * 8, 256, 7168, 2048),
    ("deepseek-v3 down", TOKENS * 8, 256, 2048, 7168),
    ("deepseek-v2-lite gate", TOKENS * 6, 64, 2048, 1408),
    ("qwen3-30b-a3b gate", TOKENS * 8, 128, 2048, 768),
    ("qwen3-30b-a3b down", TOKENS * 8, 128, 768, 2048),
    ("qwen3-235b-a22b gate", TOKENS * 8, 128, 4096, 1536),
    ("olmoe-1b-7b gate", TOKENS * 8, 64, 2048, 1024),
    ("dbrx gate", TOKENS * 4, 16, 6144, 10752),
]
REL_ERR_BOUND = 1e-2  # against the dequantized float32 product, bf16 out
CHECKED_ROWS = 256  # per sampled group: the reference is one group's dense product


def flops(rows, n, k) -> float:
    return 2.0 * rows * n * k


def grouped_row() -> str | None:
    names = _ffi.compiled_variant_names()
    return next(
        (v.name for v in tables.load_menu() if v.dtype == "e4m3" and v.problem == "ragged_m" and v.name in names),
        None,
    )


def sizes_of(rows, groups):
    return jnp.asarray(bench_ragged.uniform_sizes(rows, groups), jnp.int32)


def kernel_operands(rows, groups, k, n):
    sets = timing.rotation(rows * k + groups * n * k + 2 * rows * n)
    keys = jax.random.split(jax.random.key(7), sets)
    return [(*scaled_grouped_operands(key, rows, n, k, groups, E4M3), sizes_of(rows, groups)) for key in keys]


def check(plan, operands) -> float:
    """Relative error of the kernel against the float32 product of the
    dequantized operands, on up to CHECKED_ROWS rows of the first, middle and
    last group (a reference over every group would expand them all)."""
    a, b, scale_a, scale_b, sizes = operands
    out = np.asarray(jax.jit(lambda *xs: scaled_ragged_dot(*xs, plan=plan))(*operands), np.float64)
    if not np.isfinite(out).all():
        return float("inf")
    starts = np.concatenate([[0], np.cumsum(np.asarray(sizes))])
    one_group = jax.jit(lambda *xs: xla_scaled_ragged(*xs, out_dtype=jnp.float32, plan=plan))
    got, want = [], []
    for g in sorted({0, len(sizes) // 2, len(sizes) - 1}):
        lo, hi = int(starts[g]), int(min(starts[g + 1], starts[g] + CHECKED_ROWS))
        if hi > lo:
            size = jnp.asarray([hi - lo], jnp.int32)
            want.append(np.asarray(one_group(a[lo:hi], b[g : g + 1], scale_a[lo:hi], scale_b[g : g + 1], size)))
            got.append(out[lo:hi])
    got, want = np.concatenate(got), np.concatenate(want).astype(np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def bf16_operands(rows, groups, k, n):
    sets = timing.rotation(2 * (rows * k + groups * k * n + rows * n))
    keys = jax.random.split(jax.random.key(11), 2 * sets)
    return [
        (
            common.randn(keys[2 * i], (rows, k), jnp.bfloat16),
            common.randn(keys[2 * i + 1], (groups, k, n), jnp.bfloat16),
            sizes_of(rows, groups),
        )
        for i in range(sets)
    ]


def time_xla_bf16(args, iterations) -> dict:
    """XLA's `lax.ragged_dot` on the bf16 operands, or why it cannot run them."""
    try:
        return {"xla_bf16_ms": timing.cupti_ms(lax.ragged_dot, args, iterations)}
    except Exception as exc:  # e.g. its dense expansion does not fit: record it
        return {"xla_bf16_error": f"{type(exc).__name__}: {exc}"[:300]}


def time_bf16(args, iterations) -> float:
    return timing.cupti_ms(jax_cluster.ragged_dot, args, iterations)


def time_torch(torch, rows, groups, k, n, iterations) -> float:
    sets = timing.rotation(rows * k + groups * n * k + 2 * rows * n)
    offs = torch.cumsum(torch.tensor(bench_ragged.uniform_sizes(rows, groups), device="cuda"), 0).to(torch.int32)
    args = []
    for _ in range(sets):
        a = torch.randn(rows, k, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(groups, n, k, device="cuda").to(torch.float8_e4m3fn).transpose(-2, -1)  # [G,K,N], K-major
        scale_a = torch.rand(rows, device="cuda") + 0.5
        scale_b = torch.rand(groups, n, device="cuda") + 0.5
        args.append((a, b, scale_a, scale_b))

    def fn(a, b, scale_a, scale_b):
        return torch._scaled_grouped_mm(a, b, scale_a, scale_b, offs=offs, out_dtype=torch.bfloat16)

    return bench_ragged.torch_event_ms(torch, fn, args, iterations)


def plot(payload, path):
    rows = [r for r in payload["rows"] if r.get("jc_ms") and r.get("torch_ms")]
    common.plot_pairs(
        path,
        [f"{r['model']} {r['rows']}x{r['k']}x{r['n']} G={r['groups']}" for r in rows],
        [r["torch_ms"] for r in rows],
        [r["jc_ms"] for r in rows],
        baseline_label="torch._scaled_grouped_mm (row-wise)",
        ours_label="jax_cluster (1x128 / 128x128 blocks)",
        ratios=[r["jc_vs_torch"] for r in rows],
        ylabel="ms (device time); label: torch / jax_cluster",
        title=f"fp8 e4m3 grouped GEMM, bf16 out, {payload['device']}",
    )


def measure(model, rows, groups, k, n, torch, why_no_torch, iterations) -> dict:
    row = {"model": model, "rows": rows, "groups": groups, "k": k, "n": n}
    plan = None
    if grouped_row() is None:
        row["jc_error"] = "no block-scaled grouped row is compiled for this device"
    elif k % tables.SCALE_BLOCK:
        row["jc_error"] = f"K = {k} is not a multiple of the scale block {tables.SCALE_BLOCK}"
    else:
        plan = jax_cluster.plan_ragged(
            rows,
            n,
            k,
            groups,
            problem="ragged_m",
            dtype=E4M3,
            out_dtype=jnp.bfloat16,
            a_major="k",
            b_major="k",
        )
        row["path"], row["variant"] = plan.path, plan.variant
    if plan is not None and plan.uses_kernel:
        args = kernel_operands(rows, groups, k, n)
        row["rel_err_vs_dequantized_f32"] = check(plan, args[0])
        if row["rel_err_vs_dequantized_f32"] <= REL_ERR_BOUND:
            row["jc_ms"] = timing.cupti_ms(lambda *xs: scaled_ragged_dot(*xs, plan=plan), args, iterations)
        else:
            row["jc_error"] = "wrong result"
    elif plan is not None:
        row["jc_error"] = plan.reason
    bf16_args = bf16_operands(rows, groups, k, n)
    row["jc_bf16_ms"] = time_bf16(bf16_args, iterations)
    row.update(time_xla_bf16(bf16_args, iterations))
    del bf16_args
    if torch is None:
        row["torch_error"] = why_no_torch
    else:
        try:
            row["torch_ms"] = time_torch(torch, rows, groups, k, n, iterations)
        except Exception as exc:  # an outside reference: record why, keep going
            row["torch_error"] = f"{type(exc).__name__}: {exc}"[:300]
    if row.get("jc_ms"):
        bench_fp8_dense.add_ratios(row, flops(rows, n, k))
    if row.get("torch_ms"):
        row["torch_tflops"] = flops(rows, n, k) / row["torch_ms"] / 1e9
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_out_argument(parser)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--list", action="store_true", help="print the shapes and exit")
    args = parser.parse_args(argv)
    if args.list:
        for model, rows, groups, k, n in SHAPES:
            print(f"{model:<24} rows={rows:<6} G={groups:<4} K={k:<6} N={n}")
        return
    torch, why_no_torch = bench_ragged.load_torch_with("_scaled_grouped_mm")
    rows = []
    for shape in SHAPES:
        rows.append(measure(*shape, torch, why_no_torch, args.iterations))
        print(json.dumps(rows[-1]), flush=True)
        payload = bench_fp8_dense.results_payload(rows, torch, routing="uniform group sizes")
        common.write_results(common.results_dir(args.out), "fp8_grouped", payload, plot)
    print(json.dumps(payload["summary"], indent=1))


if __name__ == "__main__":
    main()
