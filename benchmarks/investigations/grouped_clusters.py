"""Grouped GEMMs of wide experts on 2-CTA clusters: the static cluster rows
(kind grouped_static, CUTLASS's group scheduler; ragged_m with A multicast
along N, and for the forward also B along M as torch runs it; ragged_k with
B multicast along M) against the planner's default (the work queue on 1x1
clusters) and torch._grouped_mm, one product at a time.

The three products of one expert weight, as MoEMLP's backward runs them:
fwd (rows x [G,K,N]), d_lhs (dy x [G,K,N] read as [G,N,K]) and d_rhs (the
ragged_k weight gradient). The rows come out of a rows x G x K x N case of
bench_ragged (uniform and Dirichlet(0.5) group sizes). Each contender is
checked against float32 per-group dots before it is timed (device time from
CUPTI; torch by CUDA events). The static rows are `validated: false` in the
menu, so they run here through pinned plans only.

    python benchmarks/investigations/grouped_clusters.py --out DIR
    python benchmarks/investigations/grouped_clusters.py --cases 16384x8x6144x16384 --dists uniform
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import bench_ragged  # noqa: E402
import common  # noqa: E402

import jax_cluster  # noqa: E402
from jax_cluster.primitives.ragged import ragged  # noqa: E402
from jax_cluster.tuning import timing  # noqa: E402

# gate (or up) and down of Mixtral 8x7B and 8x22B, DBRX and Phi-3.5-MoE at 8192 tokens
CASES = "16384x8x4096x14336,16384x8x6144x16384,16384x8x16384x6144,32768x16x6144x10752,16384x16x4096x6400"
# the static rows of each product by their cluster; the forward also along M (torch's choice)
STATIC_ROWS = {
    "fwd": {
        "static_1x2": "sm90_grouped_gemm_ragged_m_bf16_bf16_kn_128x256x64_c1x2_s4_grouped_static",
        "static_2x1": "sm90_grouped_gemm_ragged_m_bf16_bf16_kn_128x256x64_c2x1_s4_grouped_static",
    },
    "d_lhs": {"static_1x2": "sm90_grouped_gemm_ragged_m_bf16_bf16_kk_128x256x64_c1x2_s4_grouped_static"},
    "d_rhs": {"static_2x1": "sm90_grouped_gemm_ragged_k_bf16_bf16_mn_128x256x64_c2x1_s4_grouped_static"},
}


def product_fn(case, product: str, variant: str | None):
    """(fn, names of its inputs): the product as one grouped call, on the
    planner's choice or pinned to `variant`."""
    view = bench_ragged.gemm_view(case, product)
    pins = {"variant": variant} if variant else {}
    plan = jax_cluster.plan_ragged(
        view["m"],
        view["n"],
        view["k"],
        case.g,
        dtype=jnp.bfloat16,
        problem=view["problem"],
        b_major=view["b_major"],
        **pins,
    )
    if product == "fwd":
        return (lambda lhs, rhs, gs: jax_cluster.ragged_dot(lhs, rhs, gs, plan=plan)), ("lhs", "rhs"), plan
    if product == "d_lhs":
        return (
            (lambda dy, rhs, gs: jax_cluster.ragged_dot(dy, rhs, gs, rhs_layout="gnk", plan=plan)),
            ("dy", "rhs"),
            plan,
        )
    return (lambda lhs, dy, gs: ragged(lhs, dy, gs, problem="ragged_k", b_major="n", plan=plan)), ("lhs", "dy"), plan


def jc_result(case, product, inputs, gs, reference, variant):
    try:
        fn, names, plan = product_fn(case, product, variant)
    except Exception as e:
        return {"status": f"failed: {bench_ragged.brief(e)}"}
    args_list = [(*(inp[n] for n in names), gs) for inp in inputs]
    result = bench_ragged.check_then_time(
        lambda: jax.jit(fn)(*args_list[0]),
        lambda: timing.cupti_ms(fn, args_list, 10),
        reference,
        case.flops,
        "cupti",
    )
    result["variant"] = plan.variant or "xla"
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_out_argument(parser)
    parser.add_argument("--cases", default=CASES, help="MxGxKxN,... (rows x groups x K x N)")
    parser.add_argument("--dists", default="uniform,skewed")
    parser.add_argument("--products", default="fwd,d_lhs,d_rhs")
    args = parser.parse_args(argv)
    torch, why_not = bench_ragged.load_torch()
    rows = []
    for m, g, k, n in bench_ragged.parse_shapes(args.cases):
        for dist in args.dists.split(","):
            case = bench_ragged.Case(m, g, k, n, dist, tuple(bench_ragged.group_sizes(dist, m, g)))
            gs = jnp.asarray(case.sizes, jnp.int32)
            inputs = bench_ragged.make_inputs(case, timing.rotation(bench_ragged.bytes_per_set(case)))
            t_state = (
                (torch, why_not, *bench_ragged.torch_inputs(torch, case, inputs))
                if torch
                else (None, why_not, None, None)
            )
            for product in args.products.split(","):
                reference = bench_ragged.grouped_reference(case, product, inputs[0])
                row = {"case": case.shape, "distribution": dist, "product": product, "flops": case.flops}
                row["default"] = jc_result(case, product, inputs, gs, reference, None)
                for name, variant in STATIC_ROWS[product].items():
                    row[name] = jc_result(case, product, inputs, gs, reference, variant)
                settings = argparse.Namespace(iterations=10, torch_note=None)
                row["torch"] = bench_ragged.bench_torch(case, product, t_state, reference, settings)
                ms = {k: row[k].get("ms") for k in ("default", *STATIC_ROWS[product], "torch")}
                print(case.shape, dist, product, " ".join(f"{k} {v:.3f}" if v else f"{k} -" for k, v in ms.items()))
                rows.append(row)
                del reference
    payload = {**common.run_record(), "rows": rows}
    folder = args.out if args.out is not None else common.results_dir() / "investigations"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "grouped_clusters.json"
    path.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
