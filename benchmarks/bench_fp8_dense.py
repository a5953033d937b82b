"""Block-scaled fp8 dense GEMMs: jax_cluster's kernel against torch's
row-wise scaled fp8 GEMM and jax_cluster's own bf16 path, in one process.

jax_cluster ("jc"): the block-scaled kernel on A [M,K] in 1x128 tiles and
B [N,K] in 128x128 blocks, float32 scales (DeepSeek-V3's recipe), bf16 out,
with the weight already laid out [N,K]; "jc_op" is `jax_cluster.matmul` on
QArrays with a [K,N] weight, which transposes its fp8 values first.
torch: `torch._scaled_mm` with row-wise scales (one per row of A and column
of B; it refuses 128x128 blocks on the H200), an outside reference only.
jc_bf16: `jax_cluster.matmul` on the bf16 operands (its planner's choice,
the kernel or XLA's dot). XLA, side by side: what it makes of jnp's fp8
recipe (e4m3 operands times per-tensor float32 scales, then a dot; xla_fp8_ms,
with the kernels it ran in xla_fp8_kernels: on jax 0.11.2 a dequantizing
fusion per operand and a bf16 GEMM, not an fp8 one) and its bf16 dot
(xla_bf16_ms). jax_cluster's results are checked against the
float32 product of the dequantized operands first. Device time: CUPTI for
JAX, CUDA events for torch (bench_ragged.torch_event_ms); inputs rotate past
L2. Writes fp8_dense.json (rows[] with the shape, jc_ms, jc_op_ms, torch_ms,
jc_bf16_ms, xla_fp8_ms, xla_bf16_ms and their ratios) and a PNG.

    python benchmarks/bench_fp8_dense.py --out benchmarks/results/h200
    python benchmarks/bench_fp8_dense.py --list
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
import bench_ragged  # noqa: E402
import common  # noqa: E402

import jax_cluster  # noqa: E402
from jax_cluster.primitives.lowering import xla_scaled_gemm  # noqa: E402
from jax_cluster.primitives.scaled_gemm import scaled_gemm  # noqa: E402
from jax_cluster.tools.selftest import scaled_operands  # noqa: E402
from jax_cluster.tuning import timing  # noqa: E402

E4M3 = jnp.float8_e4m3fn
REL_ERR_BOUND = 1e-2  # against the dequantized float32 product, bf16 out
# (model, M tokens, N, K): forward products of real layers at training token counts
SHAPES = [
    ("square", 4096, 4096, 4096),
    ("square", 8192, 8192, 8192),
    ("llama3-8b mlp up", 8192, 14336, 4096),
    ("llama3-8b mlp down", 8192, 4096, 14336),
    ("llama3-8b attn qkv", 8192, 6144, 4096),
    ("llama3-70b mlp up", 8192, 28672, 8192),
    ("deepseek-v3 shared expert", 16384, 2048, 7168),
    ("qwen3-235b attn out", 8192, 4096, 8192),
]


def flops(m, n, k) -> float:
    return 2.0 * m * n * k


def check(m, n, k, plan) -> float:
    """Max-normalised error of the kernel against the float32 product of its dequantized operands."""
    operands = scaled_operands(jax.random.key(m + n + k), m, n, k, E4M3)
    out = jax.jit(lambda *xs: scaled_gemm(*xs, plan=plan))(*operands)
    ref = jax.jit(lambda *xs: xla_scaled_gemm(*xs, out_dtype=jnp.float32, plan=plan))(*operands)
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    if not np.isfinite(out).all():
        return float("inf")
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def kernel_operands(m, n, k):
    sets = timing.rotation((m * k + n * k) + 2 * m * n)
    return [scaled_operands(key, m, n, k, E4M3) for key in jax.random.split(jax.random.key(7), sets)]


def time_kernel(plan, kernel_args, iterations) -> float:
    return timing.cupti_ms(lambda *xs: scaled_gemm(*xs, plan=plan), kernel_args, iterations)


def time_jc(m, n, k, plan, iterations) -> tuple[float, float]:
    """(kernel ms on [N,K] weights, matmul-op ms on [K,N] QArrays)."""
    kernel_args = kernel_operands(m, n, k)
    kernel_ms = time_kernel(plan, kernel_args, iterations)
    op_args = []
    for a, b, sa, sb in kernel_args:  # the same values as QArrays of x [M,K] and w [K,N]
        qx = jax_cluster.quantize(jnp.zeros((m, k), jnp.float32))
        qw = jax_cluster.quantize(jnp.zeros((k, n), jnp.float32), block=(128, 128))
        op_args.append((qx.replace(qvalue=a, scale=sa.T), qw.replace(qvalue=b.T, scale=sb)))
    op_ms = timing.cupti_ms(lambda qx, qw: jax_cluster.matmul(qx, qw, plan=plan), op_args, iterations)
    return kernel_ms, op_ms


def time_pinned(m, n, k, variants, iterations) -> dict:
    """Kernel ms of each named row, pinned; a row that cannot run this shape gets its reason."""
    kernel_args = kernel_operands(m, n, k)
    out = {}
    for name in variants:
        plan = jax_cluster.plan(m, n, k, dtype=E4M3, out_dtype=jnp.bfloat16, b_major="k", variant=name)
        if plan.path != "kernel":
            out[name] = plan.reason
        elif check(m, n, k, plan) > REL_ERR_BOUND:
            out[name] = "wrong result"
        else:
            out[name] = time_kernel(plan, kernel_args, iterations)
    return out


def time_bf16(m, n, k, iterations) -> float:
    sets = timing.rotation(2 * (m * k + n * k + m * n))
    keys = jax.random.split(jax.random.key(11), 2 * sets)
    args = [
        (common.randn(keys[2 * i], (m, k), jnp.bfloat16), common.randn(keys[2 * i + 1], (k, n), jnp.bfloat16))
        for i in range(sets)
    ]
    return timing.cupti_ms(jax_cluster.matmul, args, iterations)


def xla_fp8_dot(a, b, scale_a, scale_b):
    """jnp's fp8 recipe as users write it: dequantize by per-tensor scales,
    then contract K of A [M,K] with K of B [N,K]; XLA's GEMM rewriter may
    turn this into an fp8 GEMM (the benchmark records which kernels ran)."""
    a = a.astype(jnp.bfloat16) * scale_a.astype(jnp.bfloat16)
    b = b.astype(jnp.bfloat16) * scale_b.astype(jnp.bfloat16)
    return lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.bfloat16)


def time_xla(m, n, k, iterations) -> dict:
    """XLA's fp8 path (ms and the kernels it ran) and its bf16 dot, or why they cannot run."""
    row = {}
    sets = timing.rotation(m * k + n * k + 2 * m * n)
    args = []
    for key in jax.random.split(jax.random.key(13), sets):
        ka, kb, ks = jax.random.split(key, 3)
        scales = jax.random.uniform(ks, (2,), jnp.float32, 0.5, 2.0)
        a = jax.random.normal(ka, (m, k), jnp.float32).astype(E4M3)
        b = jax.random.normal(kb, (n, k), jnp.float32).astype(E4M3)
        args.append((a, b, scales[0], scales[1]))
    try:
        row["xla_fp8_ms"], kernels = timing.cupti_kernels(xla_fp8_dot, args, iterations)
        row["xla_fp8_kernels"] = [name for name, _ in kernels]
    except Exception as exc:  # a contender that cannot run records why
        row["xla_fp8_error"] = f"{type(exc).__name__}: {exc}"[:300]
    bf16_args = [(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16).T) for a, b, _, _ in args]
    try:
        row["xla_bf16_ms"] = timing.cupti_ms(jnp.dot, bf16_args, iterations)
    except Exception as exc:
        row["xla_bf16_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return row


def time_torch(torch, m, n, k, iterations) -> float:
    sets = timing.rotation(m * k + n * k + 2 * m * n)
    args = []
    for _ in range(sets):
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()  # column-major [K, N]
        scale_a = torch.rand(m, 1, device="cuda") + 0.5
        scale_b = torch.rand(1, n, device="cuda") + 0.5
        args.append((a, b, scale_a, scale_b))

    def fn(a, b, scale_a, scale_b):
        return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)

    return bench_ragged.torch_event_ms(torch, fn, args, iterations)


def add_ratios(row: dict, work: float) -> None:
    """jax_cluster's TFLOP/s and its speed-up over each contender that ran."""
    row["jc_tflops"] = work / row["jc_ms"] / 1e9
    row["jc_vs_bf16"] = row["jc_bf16_ms"] / row["jc_ms"] if row.get("jc_bf16_ms") else None
    row["jc_vs_torch"] = row["torch_ms"] / row["jc_ms"] if row.get("torch_ms") else None
    for contender in ("xla_fp8", "xla_bf16"):
        if row.get(f"{contender}_ms"):
            row[f"jc_vs_{contender}"] = row[f"{contender}_ms"] / row["jc_ms"]


def results_payload(rows: list[dict], torch, **extra) -> dict:
    """The JSON of an fp8 benchmark run: its rows, what they ran on, and the summary."""
    return {
        "device": common.device_name(),
        "jax_version": jax.__version__,
        "torch_version": getattr(torch, "__version__", None),
        "commit": common.run_record()["commit"],
        "timing": "CUPTI kernel time (JAX); CUDA events around back-to-back calls (torch)",
        **extra,
        "summary": {
            "geomean_jc_vs_torch": bench_ragged.geomean(r.get("jc_vs_torch") for r in rows),
            "geomean_jc_vs_bf16": bench_ragged.geomean(r.get("jc_vs_bf16") for r in rows),
            "geomean_jc_vs_xla_fp8": bench_ragged.geomean(r.get("jc_vs_xla_fp8") for r in rows),
            "geomean_jc_vs_xla_bf16": bench_ragged.geomean(r.get("jc_vs_xla_bf16") for r in rows),
            "max_rel_err_vs_dequantized_f32": max((r.get("rel_err_vs_dequantized_f32", 0) for r in rows), default=None),
        },
        "rows": rows,
    }


def plot(payload, path):
    rows = [r for r in payload["rows"] if r.get("jc_ms") and r.get("torch_ms")]
    common.plot_pairs(
        path,
        [f"{r['model']} {r['m']}x{r['n']}x{r['k']}" for r in rows],
        [r["torch_ms"] for r in rows],
        [r["jc_ms"] for r in rows],
        baseline_label="torch._scaled_mm (row-wise)",
        ours_label="jax_cluster (1x128 / 128x128 blocks)",
        ratios=[r["jc_vs_torch"] for r in rows],
        ylabel="ms (device time); label: torch / jax_cluster",
        title=f"fp8 e4m3 dense GEMM, bf16 out, {payload['device']}",
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_out_argument(parser)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--list", action="store_true", help="print the shapes and exit")
    parser.add_argument(
        "--variants",
        default="",
        help="comma-separated block-scaled menu rows to time as well, each pinned (rows[].pinned_ms)",
    )
    args = parser.parse_args(argv)
    if args.list:
        for model, m, n, k in SHAPES:
            print(f"{model:<28} M={m:<6} N={n:<6} K={k}")
        return
    torch, why_no_torch = bench_ragged.load_torch_with("_scaled_mm")
    extra = [name for name in args.variants.split(",") if name]
    rows = []
    for model, m, n, k in SHAPES:
        row = {"model": model, "m": m, "n": n, "k": k}
        plan = jax_cluster.plan(m, n, k, dtype=E4M3, out_dtype=jnp.bfloat16, b_major="k")
        row["path"], row["variant"] = plan.path, plan.variant
        if plan.path == "kernel":
            row["rel_err_vs_dequantized_f32"] = check(m, n, k, plan)
            row["jc_ms"], row["jc_op_ms"] = time_jc(m, n, k, plan, args.iterations)
            if extra:
                row["pinned_ms"] = time_pinned(m, n, k, extra, args.iterations)
        else:
            row["jc_ms"] = row["jc_op_ms"] = None
            row["jc_error"] = plan.reason
        row["jc_bf16_ms"] = time_bf16(m, n, k, args.iterations)
        row.update(time_xla(m, n, k, args.iterations))
        row["torch_ms"] = time_torch(torch, m, n, k, args.iterations) if torch is not None else None
        if torch is None:
            row["torch_error"] = why_no_torch
        if row["jc_ms"]:
            add_ratios(row, flops(m, n, k))
        if row["torch_ms"]:
            row["torch_tflops"] = flops(m, n, k) / row["torch_ms"] / 1e9
        rows.append(row)
        print(json.dumps(row), flush=True)
        payload = results_payload(rows, torch)
        common.write_results(common.results_dir(args.out), "fp8_dense", payload, plot)
    print(json.dumps(payload["summary"], indent=1))


if __name__ == "__main__":
    main()
