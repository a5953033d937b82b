"""The gated epilogue, forward: the MoE MLP's gate and up with act(gate) * up
written by the grouped GEMM's epilogue, against the same layer without it,
side by side in one run.

For each configuration of bench_moe_mlp (training token count, uniform and
skewed routing), two units are timed forward only, as inference runs them:
- the gate and up products alone: `jax_cluster.gated_ragged_dot` (`gated_ms`:
  one grouped GEMM over the interleaved [E, D, 2H] weights whose epilogue
  writes the [T, H] product) against `jax_cluster.ragged_dot` over the same
  weights followed by the gate on XLA (`product_then_gate_ms`: the [T, 2H]
  pre-activation written and read back) and against two grouped products,
  gate and up, then act(gate) * up (`separate_ms`, the unfused layer's);
- `MoEMLP.routed` forward: the default layer (`layer_ms`, separate gate and
  up) against `fuse_gate_up=True` with the gated epilogue (`layer_gated_ms`)
  and with one product gated on XLA (`layer_product_then_gate_ms`).
Every output is checked first: the gated products against a float32
reference of sampled rows, the fused layer against the default one.
Device time from CUPTI. Writes gated.json and a PNG.

    python benchmarks/bench_gated.py --out benchmarks/results/h200
    python benchmarks/bench_gated.py --smoke          # tiny shapes, any device
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import bench_moe_mlp as moe  # noqa: E402
import bench_ragged  # noqa: E402
import common  # noqa: E402

import jax_cluster  # noqa: E402
from jax_cluster.tuning import timing  # noqa: E402
from jax_cluster.tuning.accuracy import relative_error  # noqa: E402

ROUTINGS = ("uniform", "skewed")
SAMPLED_ROWS = 512
MAX_REL_ERR = 2e-2  # bf16 output against float32; the layers against each other


def sampled_reference(x, gate, up, sizes, rows):
    """act(x @ gate_g) * (x @ up_g) in float32 for the first `rows` rows (sorted
    by group, so a few groups' weights at a time)."""
    owner = np.searchsorted(np.cumsum(np.asarray(sizes)), np.arange(rows), side="right")
    parts = []
    for g in np.unique(owner):
        xs = x[:rows][owner == g].astype(jnp.float32)
        hi = jax.lax.Precision.HIGHEST
        gated = jnp.dot(xs, gate[g].astype(jnp.float32), precision=hi)
        parts.append(jax.nn.silu(gated) * jnp.dot(xs, up[g].astype(jnp.float32), precision=hi))
    return jnp.concatenate(parts)


def product_row(cfg, tokens, routing, timer, iterations):
    rows_total = tokens * cfg.top_k
    experts_of = moe.assignment(routing, tokens, cfg.experts, cfg.top_k)
    sizes = jnp.asarray(np.bincount(experts_of.reshape(-1), minlength=cfg.experts).astype(np.int32))
    kx, kg, ku = jax.random.split(jax.random.key(cfg.features + tokens), 3)
    x = common.randn(kx, (rows_total, cfg.features), moe.DTYPE)
    gate, up = (common.randn(k, (cfg.experts, cfg.features, cfg.hidden), moe.DTYPE) for k in (kg, ku))
    gate_up = jax_cluster.interleave_gate_up(gate, up)

    def gated(x, w, s):
        return jax_cluster.gated_ragged_dot(x, w, s)

    def product_then_gate(x, w, s):
        g, u = jax_cluster.split_gate_up_blocks(jax_cluster.ragged_dot(x, w, s))
        return jax.nn.silu(g) * u

    def separate(x, g, u, s):
        return jax.nn.silu(jax_cluster.ragged_dot(x, g, s)) * jax_cluster.ragged_dot(x, u, s)

    plan = jax_cluster.plan_ragged(
        rows_total, 2 * cfg.hidden, cfg.features, cfg.experts, problem="ragged_m", dtype=moe.DTYPE, epilogue="gated"
    )
    row = {"config": cfg.name, "tokens": tokens, "routing": routing, "rows": rows_total, "gated_plan": plan.variant}
    row["gated_plan_reason"] = plan.reason
    sampled = min(SAMPLED_ROWS, rows_total)
    want = sampled_reference(x, gate, up, sizes, sampled)
    contenders = {
        "gated": (gated, (x, gate_up, sizes)),
        "product_then_gate": (product_then_gate, (x, gate_up, sizes)),
        "separate": (separate, (x, gate, up, sizes)),
    }
    for name, (fn, args) in contenders.items():
        try:
            out = jax.jit(fn)(*args)
            row[f"{name}_rel_err_vs_f32"] = err = float(relative_error(out[:sampled], want))
            del out
            if err < MAX_REL_ERR:
                row[f"{name}_ms"] = timer(fn, [args], iterations)
            else:
                row[f"{name}_error"] = f"wrong: relative error {err:.2e} against float32"
        except Exception as e:
            row[f"{name}_error"] = bench_ragged.brief(e)
    return row


def layer_row(cfg, tokens, routing, timer, iterations):
    """MoEMLP.routed forward, default against fuse_gate_up=True (same weights)."""
    experts_of, (order, weights, sizes), (x, _) = moe.case_inputs(cfg, tokens, routing)
    graph, state = moe.make_layer(cfg, jax_cluster.ragged_dot, abstract=False)
    fused_graph, fused_state = moe.fused_layer(cfg, state)

    def forward(graph):
        def run(state, x, order, weights, sizes):
            return nnx.merge(graph, state).routed(x[None], order[None], weights[None], sizes[None])[0]

        return run

    # the fused layer with the gate on XLA: an activation the epilogue does not know by name
    on_xla = nnx.merge(fused_graph, fused_state)
    on_xla.activation = silu_on_xla
    xla_gate_graph, _ = nnx.split(on_xla)
    row = {}
    ours = jax.jit(forward(graph))(state, x, order, weights, sizes)
    row["layer_ms"] = timer(forward(graph), [(state, x, order, weights, sizes)], iterations)
    for name, g in (("layer_gated", fused_graph), ("layer_product_then_gate", xla_gate_graph)):
        fused = jax.jit(forward(g))(fused_state, x, order, weights, sizes)
        row[f"{name}_rel_err_vs_layer"] = err = float(relative_error(fused, ours.astype(jnp.float32)))
        del fused
        if err < MAX_REL_ERR:
            row[f"{name}_ms"] = timer(forward(g), [(fused_state, x, order, weights, sizes)], iterations)
        else:
            row[f"{name}_error"] = f"wrong: relative error {err:.2e} against the default layer"
    return row


def silu_on_xla(x):
    """jax.nn.silu under another name, so GroupedLinear.gated gates on XLA."""
    return jax.nn.silu(x)


def plot(payload, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in payload["rows"] if r.get("gated_ms") and r.get("product_then_gate_ms")]
    labels = [f"{r['config']}\n{r['routing']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(8, 0.6 * len(rows)), 4.5))
    xs = np.arange(len(rows))
    for i, (key, name) in enumerate(
        [("product_then_gate_ms", "one product, gate on XLA"), ("separate_ms", "gate and up apart")]
    ):
        ax.bar(xs + (i - 0.5) * 0.4, [r[key] / r["gated_ms"] if r.get(key) else 0 for r in rows], 0.4, label=name)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(xs, labels, rotation=60, fontsize=7)
    ax.set_ylabel("their time / gated epilogue's")
    ax.set_title(f"gate and up forward, gated epilogue ({payload['device']}, {payload['date']})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_out_argument(parser)
    parser.add_argument("--configs", default="", help="comma-separated configuration names (default: all)")
    parser.add_argument("--routings", default=",".join(ROUTINGS), help=f"comma-separated, of {ROUTINGS}")
    parser.add_argument("--tokens", type=int, default=moe.TRAINING_TOKENS)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, any device")
    args = parser.parse_args(argv)
    configs = moe.SMOKE if args.smoke else moe.CONFIGS
    if args.configs:
        configs = [c for c in configs if c.name in args.configs.split(",")]
    tokens = 64 if args.smoke else args.tokens
    probe = jnp.zeros((8,), jnp.float32)
    timer = timing.cupti_ms if timing.cupti_works(probe) else timing.wall_ms
    rows = []
    for cfg in configs:
        for routing in args.routings.split(","):
            row = product_row(cfg, tokens, routing, timer, args.iterations)
            try:
                row.update(layer_row(cfg, tokens, routing, timer, args.iterations))
            except Exception as e:
                row["layer_error"] = bench_ragged.brief(e)
            row["timing"] = "cupti" if timer is timing.cupti_ms else "wall"
            rows.append(row)
            brief = {k: round(v, 3) for k, v in row.items() if k.endswith("_ms") and v}
            print(cfg.name, routing, brief, {k: v for k, v in row.items() if k.endswith("_error")}, flush=True)
            moe.release_memory()
    payload = {**common.run_record(), "tokens": tokens, "rows": rows}
    common.write_results(common.results_dir(args.out), "gated", payload, plot)


if __name__ == "__main__":
    main()
