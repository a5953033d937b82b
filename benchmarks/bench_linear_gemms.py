"""The three GEMMs of one Linear training step, each against XLA's dot.

A Linear(D_in -> D_out) step on T tokens runs the forward x·W (A [M,K], B
[K,N]: "kn"), the input gradient dz·Wᵀ (B read as [N,K]: "kk") and the
weight gradient xᵀ·dz (A read as [K,M]: "mn"). This times each one with the
planner's choice and with every compiled variant of its layout, and the
forward also with the fused bias/activation/residual kernel that
`jax_cluster.linear` runs, so a slow layer step can be traced to the GEMM and
the variant behind it.

    python benchmarks/bench_linear_gemms.py --out benchmarks/results/h200
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import jax
import jax.numpy as jnp
from jax import lax

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import common  # noqa: E402

import jax_cluster  # noqa: E402
from jax_cluster import _ffi  # noqa: E402
from jax_cluster.planning import tables  # noqa: E402
from jax_cluster.primitives.epilogue import gemm_epilogue  # noqa: E402
from jax_cluster.primitives.gemm import gemm  # noqa: E402
from jax_cluster.tuning import timing  # noqa: E402

LAYERS = [(8192, 4096, 16384), (8192, 16384, 4096), (2048, 2048, 8192)]  # T, D_in, D_out


def products(t, d_in, d_out):
    """(name, M, N, K, a_major, b_major) of the step's three GEMMs."""
    return [
        ("fwd x·W", t, d_out, d_in, "k", "n"),
        ("dx dz·Wᵀ", t, d_in, d_out, "k", "k"),
        ("dW xᵀ·dz", d_in, d_out, t, "m", "n"),
    ]


def operands(key, m, n, k, a_major, b_major):
    ka, kb = jax.random.split(key)
    a = common.randn(ka, (m, k) if a_major == "k" else (k, m), jnp.bfloat16)
    b = common.randn(kb, (k, n) if b_major == "n" else (n, k), jnp.bfloat16)
    return a, b


def xla_dot(a_major, b_major):
    dims = (((1 if a_major == "k" else 0,), (0 if b_major == "n" else 1,)), ((), ()))
    return lambda a, b: lax.dot_general(a, b, dims, preferred_element_type=jnp.bfloat16)


def bench_product(m, n, k, a_major, b_major, iterations):
    sets = timing.rotation(2 * (m * k + k * n))
    args = [operands(key, m, n, k, a_major, b_major) for key in jax.random.split(jax.random.key(0), sets)]
    flops = 2 * m * n * k
    tf = lambda ms: flops / ms / 1e9  # noqa: E731
    row = {
        "m": m,
        "n": n,
        "k": k,
        "layout": a_major + b_major,
        "xla_tflops": tf(timing.cupti_ms(xla_dot(a_major, b_major), args, iterations)),
    }
    planned = jax_cluster.plan(m, n, k, dtype=jnp.bfloat16, a_major=a_major, b_major=b_major)
    row["planner"] = {"variant": planned.variant, "schedule": planned.schedule}
    compiled = _ffi.compiled_variant_names()
    row["variants"] = {}
    for v in tables.load_menu():
        if (
            v.name not in compiled
            or v.problem != "dense"
            or v.epilogue != "none"
            or (v.dtype, v.out, v.a_major, v.b_major) != ("bf16", "bf16", a_major, b_major)
        ):
            continue
        p = jax_cluster.plan(m, n, k, dtype=jnp.bfloat16, a_major=a_major, b_major=b_major, variant=v.name)
        call = lambda a, b, p=p: gemm(
            a,
            b,
            a_major=a_major,
            b_major=b_major,  # noqa: E731
            out_dtype=jnp.bfloat16,
            plan=p,
        )
        row["variants"][f"{v.name} {p.schedule}"] = tf(timing.cupti_ms(call, args, iterations))
    if (a_major, b_major) == ("k", "n"):
        row["fused"] = fused_epilogue(m, n, k, args, iterations)
    return row


def fused_epilogue(m, n, k, args, iterations):
    """The forward as `jax_cluster.linear` runs it: the bias_act kernel with a
    bias, with bias + gelu, and with bias + residual (C), against XLA's dot with
    the same epilogue; TFLOP/s of the GEMM alone, so each can be set beside
    the plain kernel above. Every compiled bias_act row is timed; "jax_cluster"
    is the planner's."""
    keys = jax.random.split(jax.random.key(1), 2)
    bias = common.randn(keys[0], (n,), jnp.bfloat16)
    res = common.randn(keys[1], (m, n), jnp.bfloat16)
    planned = jax_cluster.plan(m, n, k, dtype=jnp.bfloat16, epilogue="bias_act")
    compiled = _ffi.compiled_variant_names()
    plans = {
        v.name: jax_cluster.plan(m, n, k, dtype=jnp.bfloat16, epilogue="bias_act", variant=v.name)
        for v in tables.load_menu()
        if v.name in compiled
        and v.epilogue == "bias_act"
        and v.arch == planned.arch
        and (v.a_major, v.b_major) == ("k", "n")
    }
    tf = lambda ms: 2 * m * n * k / ms / 1e9  # noqa: E731
    # label: (activation, with the residual)
    cases = {"bias": ("none", False), "bias+gelu": ("gelu", False), "bias+residual": ("none", True)}
    out = {}
    for label, (act_name, with_res) in cases.items():
        r = res if with_res else None
        act = jax.nn.gelu if act_name == "gelu" else (lambda t: t)

        def xla(a, b, r=r, act=act):
            z = xla_dot("k", "n")(a, b).astype(jnp.float32) + bias
            return act(z if r is None else z + r).astype(jnp.bfloat16)

        by_variant = {}
        for name, plan in plans.items():

            def ours(a, b, r=r, act_name=act_name, plan=plan):
                return gemm_epilogue(
                    a, b, bias, r, b_major="n", beta=0.0 if r is None else 1.0, activation=act_name, plan=plan
                )

            by_variant[f"{name} {plan.schedule}"] = tf(timing.cupti_ms(ours, args, iterations))
        out[label] = {
            "variant": planned.variant,
            "jax_cluster": by_variant[f"{planned.variant} {planned.schedule}"],
            "by_variant": by_variant,
            "xla": tf(timing.cupti_ms(xla, args, iterations)),
        }
    return out


def plot(payload, path):
    rows = payload["rows"]
    common.plot_pairs(
        path,
        [f"{r['product']} {r['m']}x{r['n']}x{r['k']}" for r in rows],
        [r["xla_tflops"] for r in rows],
        [max(r["variants"].values(), default=0) for r in rows],
        baseline_label="XLA dot",
        ours_label="jax_cluster, best variant",
        ylabel="TFLOP/s (device time, CUPTI)",
        title=f"Linear-step GEMMs, bf16, {payload['device']}",
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_out_argument(parser)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--layers", default="", help="TxDINxDOUT,... (default: LAYERS)")
    parser.add_argument("--products", default="fwd,dx,dW", help="which of fwd,dx,dW to time")
    common.add_route_argument(parser)
    args = parser.parse_args()
    common.set_route(args.route)
    layers = [tuple(int(v) for v in text.split("x")) for text in args.layers.split(",")] if args.layers else LAYERS
    wanted = set(args.products.split(","))
    rows = []
    for layer in layers:
        for name, m, n, k, am, bm in products(*layer):
            if name.split()[0] not in wanted:
                continue
            row = dict(product=name, layer=list(layer), **bench_product(m, n, k, am, bm, args.iterations))
            rows.append(row)
            print(
                f"{name:<10} {m}x{n}x{k} ({am}{bm}): XLA {row['xla_tflops']:.0f} TF/s; "
                f"planner takes {row['planner']['variant']} {row['planner']['schedule']}",
                flush=True,
            )
            for label, tflops in row["variants"].items():
                print(f"    {tflops:6.0f} TF/s  {label}", flush=True)
            for label, t in row.get("fused", {}).items():
                for variant, tflops in t["by_variant"].items():
                    print(f"    {tflops:6.0f} TF/s  fused {label} ({variant}); XLA {t['xla']:.0f}", flush=True)
    payload = {"device": common.device_name(), "jax_version": jax.__version__, "rows": rows}
    common.write_results(
        common.results_dir(args.out), common.route_stem("linear_gemms_bf16", args.route), payload, plot
    )


if __name__ == "__main__":
    main()
