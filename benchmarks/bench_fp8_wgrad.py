"""The block-scaled fp8 weight gradient of MoE experts (ragged_k): dW[g] =
x_g^T dy_g over each expert's tokens, jax_cluster's kernel against torch's
row-wise scaled grouped GEMM and jax_cluster's own bf16 weight gradient, in
one process.

jax_cluster ("jc"): the block-scaled ragged_k kernel on x^T [K, rows] and
dy^T [N, rows], both in 1x128 tiles along the tokens, each expert's tokens
starting on a tile (the block-aligned layout), float32 scales, bf16 out.
jc_recipe: the fp8 recipe's whole weight gradient from the bf16 x and dy
(regrouping, both quantizations and the kernel: ops/fp8_grouped.py), the
quantization in XLA's fusions; jc_recipe_fused: the same with the token-tile
quantization kernel (primitives/token_tile_quantize.py).
jc_bf16: jax_cluster's bf16 ragged_k product on x and dy, the weight
gradient of its bf16 `ragged_dot`. torch: `torch._scaled_grouped_mm` in its
2d x 2d form (offsets along the contraction) with row-wise scales, an
outside reference only; a case it cannot run records why. XLA has no fp8
grouped GEMM, and its bf16 ragged contraction expands the groups densely
(bench_fp8_grouped.py times that family): it is not timed here. Group sizes
are uniform (torch wants 16-row multiples). The kernel is checked first
against the float32 product of the dequantized operands on the first, middle
and last expert. Device time: CUPTI for JAX, CUDA events for torch; inputs
rotate past L2. Writes fp8_wgrad.json (rows[] with the shape, jc_ms,
jc_recipe_ms, jc_recipe_fused_ms, torch_ms, jc_bf16_ms and ratios) and a PNG.

    python benchmarks/bench_fp8_wgrad.py --out benchmarks/results/h200
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
import bench_fp8_grouped  # noqa: E402
import bench_ragged  # noqa: E402
import common  # noqa: E402

import jax_cluster  # noqa: E402
from jax_cluster import _ffi  # noqa: E402
from jax_cluster.ops.fp8_grouped import grouped_weight_gradient  # noqa: E402
from jax_cluster.planning import tables  # noqa: E402
from jax_cluster.primitives import token_tiles  # noqa: E402
from jax_cluster.primitives.ragged import ragged  # noqa: E402
from jax_cluster.primitives.scaled_ragged import scaled_ragged_k_dot  # noqa: E402
from jax_cluster.tools.selftest import scaled_grouped_operands  # noqa: E402
from jax_cluster.tuning import timing  # noqa: E402

E4M3 = jnp.float8_e4m3fn
REL_ERR_BOUND = 1e-2  # against the dequantized float32 product, bf16 out


def weight_gradient_row() -> str | None:
    names = _ffi.compiled_variant_names()
    return next(
        (v.name for v in tables.load_menu() if v.dtype == "e4m3" and v.problem == "ragged_k" and v.name in names),
        None,
    )


def kernel_plan(rows, groups, k, n):
    """The ragged_k row, pinned: the benchmark times that kernel."""
    return jax_cluster.plan_ragged(
        k, n, rows, groups, problem="ragged_k", dtype=E4M3, out_dtype=jnp.bfloat16, a_major="k", b_major="k",
        variant=weight_gradient_row(),
    )  # fmt: skip


def kernel_operands(tokens, groups, k, n):
    rows = token_tiles.padded_rows(tokens, groups)
    sets = timing.rotation(rows * (k + n) + 2 * groups * k * n)
    keys = jax.random.split(jax.random.key(5), sets)
    sizes = bench_fp8_grouped.sizes_of(tokens, groups)
    return [(*scaled_grouped_operands(key, rows, n, k, groups, E4M3, "ragged_k"), sizes) for key in keys]


def check(plan, operands) -> float:
    """Relative error on the first, middle and last expert against the
    float32 product of the dequantized operands."""
    a, b, scale_a, scale_b, sizes = operands
    out = jax.jit(lambda *xs: scaled_ragged_k_dot(*xs, plan=plan))(*operands)
    starts, _ = token_tiles.group_starts(sizes, a.shape[1])

    @jax.jit
    def one(g):
        lo, size = starts[g], sizes[g]
        valid = jnp.arange(a.shape[1]) - lo
        valid = (valid >= 0) & (valid < size)

        def rows_of(x, s):
            x32 = x.astype(jnp.float32) * jnp.repeat(s, tables.SCALE_BLOCK, axis=0).T
            return jnp.where(valid[None, :], x32, 0.0)

        want = lax.dot_general(rows_of(a, scale_a), rows_of(b, scale_b), (((1,), (1,)), ((), ())), precision="highest")
        got = out[g].astype(jnp.float32)
        return jnp.sum((got - want) ** 2), jnp.sum(want**2)

    errs = [one(g) for g in sorted({0, len(sizes) // 2, len(sizes) - 1})]
    diff, norm = (sum(float(e[i]) for e in errs) for i in (0, 1))
    return float(np.sqrt(diff / norm)) if np.isfinite(diff) else float("inf")


def activations(tokens, groups, k, n):
    sets = timing.rotation(2 * tokens * (k + n) + 2 * groups * k * n)
    keys = jax.random.split(jax.random.key(9), 2 * sets)
    sizes = bench_fp8_grouped.sizes_of(tokens, groups)
    pairs = zip(keys[::2], keys[1::2])
    bf16 = jnp.bfloat16
    return [(common.randn(kx, (tokens, k), bf16), common.randn(kd, (tokens, n), bf16), sizes) for kx, kd in pairs]


def time_torch(torch, tokens, groups, k, n, iterations) -> float:
    """2d x 2d: x^T [K, tokens] (row-major) times dy [tokens, N] (column-major)
    with offsets along the tokens; scales per row of x^T and per column of dy, per group."""
    sets = timing.rotation(tokens * (k + n) + 2 * groups * k * n)
    offs = torch.cumsum(torch.tensor(bench_ragged.uniform_sizes(tokens, groups), device="cuda"), 0).to(torch.int32)
    args = []
    for _ in range(sets):
        a = torch.randn(k, tokens, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, tokens, device="cuda").to(torch.float8_e4m3fn).t()
        scale_a = torch.rand(groups * k, device="cuda") + 0.5
        scale_b = torch.rand(groups * n, device="cuda") + 0.5
        args.append((a, b, scale_a, scale_b))

    def fn(a, b, scale_a, scale_b):
        return torch._scaled_grouped_mm(a, b, scale_a, scale_b, offs=offs, out_dtype=torch.bfloat16)

    return bench_ragged.torch_event_ms(torch, fn, args, iterations)


def plot(payload, path):
    rows = [r for r in payload["rows"] if r.get("jc_ms") and r.get("jc_bf16_ms")]
    common.plot_pairs(
        path,
        [f"{r['model']} {r['k']}x{r['n']} G={r['groups']} T={r['rows']}" for r in rows],
        [r["jc_bf16_ms"] for r in rows],
        [r["jc_ms"] for r in rows],
        baseline_label="jax_cluster bf16 weight gradient",
        ours_label="jax_cluster fp8 (1x128 token tiles)",
        ratios=[r["jc_vs_bf16"] for r in rows],
        ylabel="ms (device time); label: bf16 / fp8",
        title=f"MoE weight gradient (ragged_k), e4m3, bf16 out, {payload['device']}",
    )


def measure(model, tokens, groups, k, n, torch, why_no_torch, iterations) -> dict:
    row = {"model": model, "rows": tokens, "groups": groups, "k": k, "n": n}
    row["padded_rows"] = token_tiles.padded_rows(tokens, groups)
    if weight_gradient_row() is None:
        row["jc_error"] = "no block-scaled ragged_k row is compiled for this device"
    else:
        plan = kernel_plan(row["padded_rows"], groups, k, n)
        row["variant"] = plan.variant
        args = kernel_operands(tokens, groups, k, n)
        row["rel_err_vs_dequantized_f32"] = check(plan, args[0])
        if row["rel_err_vs_dequantized_f32"] <= REL_ERR_BOUND:
            row["jc_ms"] = timing.cupti_ms(lambda *xs: scaled_ragged_k_dot(*xs, plan=plan), args, iterations)
        else:
            row["jc_error"] = "wrong result"
        del args
    acts = activations(tokens, groups, k, n)
    row["jc_bf16_ms"] = timing.cupti_ms(lambda x, dy, gs: ragged(x, dy, gs, problem="ragged_k"), acts, iterations)
    if row.get("jc_ms"):
        for key, fused in (("jc_recipe", False), ("jc_recipe_fused", True)):

            def recipe(x, dy, gs, fused=fused):
                return grouped_weight_gradient(x, dy, gs, E4M3, jnp.bfloat16, plan=plan, quantize_kernel=fused)

            row[f"{key}_ms"], kernels = timing.cupti_kernels(recipe, acts, iterations)
            row[f"{key}_kernels"] = [[name[:80], ms] for name, ms in kernels[:6]]  # where the recipe's time goes
    del acts
    if torch is None:
        row["torch_error"] = why_no_torch
    else:
        try:
            row["torch_ms"] = time_torch(torch, tokens, groups, k, n, iterations)
        except Exception as exc:  # an outside reference: record why, keep going
            row["torch_error"] = f"{type(exc).__name__}: {exc}"[:300]
    if row.get("jc_ms"):
        bench_fp8_dense.add_ratios(row, bench_fp8_grouped.flops(tokens, n, k))
        row["jc_recipe_vs_bf16"] = row["jc_bf16_ms"] / row["jc_recipe_ms"]
        row["jc_recipe_fused_vs_bf16"] = row["jc_bf16_ms"] / row["jc_recipe_fused_ms"]
    if row.get("torch_ms"):
        row["torch_tflops"] = bench_fp8_grouped.flops(tokens, n, k) / row["torch_ms"] / 1e9
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_out_argument(parser)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--models", default="", help="comma-separated substrings of the shapes' names (default: all)")
    args = parser.parse_args(argv)
    wanted = [w for w in args.models.split(",") if w]
    shapes = [s for s in bench_fp8_grouped.SHAPES if not wanted or any(w in s[0] for w in wanted)]
    torch, why_no_torch = bench_ragged.load_torch_with("_scaled_grouped_mm")
    rows = []
    for shape in shapes:
        rows.append(measure(*shape, torch, why_no_torch, args.iterations))
        print(json.dumps(rows[-1]), flush=True)
        payload = bench_fp8_dense.results_payload(rows, torch, routing="uniform group sizes")
        for key in ("jc_recipe_vs_bf16", "jc_recipe_fused_vs_bf16"):
            payload["summary"][f"geomean_{key}"] = bench_ragged.geomean(r.get(key) for r in rows)
        common.write_results(common.results_dir(args.out), "fp8_wgrad", payload, plot)
    print(json.dumps(payload["summary"], indent=1))


if __name__ == "__main__":
    main()
