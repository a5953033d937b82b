"""Layer-level forward + backward: jax_cluster's Flax layers against Flax's own.

Both sides get the same parameters and inputs in one process on one GPU; a
step is the gradient of a scalar loss with respect to the inputs and every
parameter (so one forward and the whole backward), timed as device time
(CUPTI) with inputs rotated past L2, else wall time (recorded per row), in
interleaved rounds (each side's median is reported).
  dense: Linear(D -> 4D) with bias and gelu, fused into the GEMM's epilogue
         on jax_cluster's side; Flax runs nnx.Linear then jax.nn.gelu.
  moe:   MoEMLP(D, H, E experts, top-k): grouped GEMMs (ragged_dot) on
         jax_cluster's side, XLA's lax.ragged_dot on Flax's.
Targets: >= 1.0x for dense layers, >= 3x for MoE layers.
--autotune first times every candidate plan of each dense layer's three GEMMs
(jax_cluster.autotune, XLA's dot among them) and runs jax_cluster's side on
the winners: the results go to layers_bf16_autotuned.*, each row naming them.

    python benchmarks/bench_layers.py --out benchmarks/results/h200 [--quick]
"""

from __future__ import annotations

import argparse
import gc
import os
import pathlib
import statistics
import sys

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import common  # noqa: E402

from jax_cluster import nn as jcnn  # noqa: E402
from jax_cluster.tuning import timing  # noqa: E402
from jax_cluster.tuning.accuracy import relative_error  # noqa: E402

DENSE = [(8192, 4096), (16384, 4096), (4096, 8192), (2048, 2048)]  # tokens, D (-> 4D)
# XLA's ragged_dot backward materialises [E, T*top_k, D] operands: at T=16384, E=64
# it asked for 74 GB on the H200, so the MoE cases keep T*top_k*E*D within reach.
MOE = [(4096, 2048, 1408, 64, 6), (8192, 4096, 14336, 8, 2), (2048, 1024, 512, 256, 8)]
TARGETS = {"dense": 1.0, "moe": 3.0}
DTYPE = jnp.bfloat16


def dense_pair(d, rngs_seed=0):
    ours = jcnn.Linear(d, 4 * d, activation="gelu", dtype=DTYPE, param_dtype=DTYPE, rngs=nnx.Rngs(rngs_seed))
    flaxs = nnx.Linear(d, 4 * d, dtype=DTYPE, param_dtype=DTYPE, rngs=nnx.Rngs(rngs_seed))
    return (ours, lambda m, x: m(x)), (flaxs, lambda m, x: jax.nn.gelu(m(x)))


def moe_pair(d, h, e, k, rngs_seed=0):
    kw = dict(dtype=DTYPE, param_dtype=DTYPE, rngs=nnx.Rngs(rngs_seed))
    ours = jcnn.MoEMLP(d, h, e, k, **kw)
    kw["rngs"] = nnx.Rngs(rngs_seed)
    flaxs = jcnn.MoEMLP(d, h, e, k, dot_general=lax.dot_general, ragged_dot=lax.ragged_dot, **kw)
    call = lambda m, x: m(x)  # noqa: E731
    return (ours, call), (flaxs, call)


def step_fn(model, call):
    """jit-able (state, x) -> grads of sum(out^2) w.r.t. x and every parameter."""
    graph, state = nnx.split(model)

    def loss(state, x):
        out = call(nnx.merge(graph, state), x)
        return jnp.sum(out.astype(jnp.float32) ** 2)

    return jax.grad(loss, argnums=(0, 1)), state


def time_step(step, state, inputs, iterations):
    """(ms, timer, [(kernel, ms)] from the timed iterations themselves, or None)."""
    fn = lambda state, x: step(state, x)  # noqa: E731
    args = [(state, x) for x in inputs]
    try:
        ms, kernels = timing.cupti_kernels(fn, args, iterations)
        return ms, "cupti", kernels
    except Exception:  # no CUPTI here: wall time, host overhead included
        return timing.wall_ms(fn, args, iterations), "wall", None


def dense_gemms(t, d):
    """The (m, n, k), a_major, b_major of a dense layer step's GEMMs, as
    jax_cluster.linear runs them: forward, dx = dz·Wᵀ, dW = xᵀ·dz."""
    return {"forward": ((t, 4 * d, d), "k", "n"), "dx": ((t, d, 4 * d), "k", "k"), "dW": ((d, 4 * d, t), "m", "n")}


def autotune_dense(t, d) -> dict:
    """Autotunes the layer's GEMMs into the cache; {GEMM: the winner's label}."""
    import jax_cluster
    from jax_cluster.tuning.autotuner import label

    won = {}
    for name, (mnk, a_major, b_major) in dense_gemms(t, d).items():
        result = jax_cluster.autotune([mnk], dtype=DTYPE, a_major=a_major, b_major=b_major, progress=False)[mnk]
        won[name] = {
            "winner": label(result.overrides) if result.overrides else None,
            "ms": result.ms,
            "xla_ms": result.xla_ms,
        }
    return won


def footprint(compiled) -> dict:
    """What one side's step needs before it runs: XLA's temporaries against the
    device's memory limit, and how many of jax_cluster's custom calls it makes
    (0 means every product fell back to XLA)."""
    temp = compiled.memory_analysis().temp_size_in_bytes / 1e9
    calls = compiled.as_text().count('custom_call_target="jax_cluster_')
    info = {"temp_gb": temp, "kernel_calls": calls}
    stats = jax.devices()[0].memory_stats() or {}
    if "bytes_limit" in stats:
        info["limit_gb"] = (stats["bytes_limit"] - stats.get("bytes_in_use", 0)) / 1e9
    return info


def flops_dense(t, d):
    return 3 * 2 * t * d * 4 * d  # forward + two backward GEMMs


def flops_moe(t, d, h, e, k):
    return 3 * 3 * 2 * t * k * d * h  # gate, up, down; forward + two backward each


def bench(kind, shape, iterations, rounds=3, breakdown=False, hlo_dir=None):
    key = jax.random.key(0)
    if kind == "dense":
        t, d = shape
        pair, flops, width = dense_pair(d), flops_dense(t, d), d
    else:
        t, d, h, e, k = shape
        pair, flops, width = moe_pair(d, h, e, k), flops_moe(t, d, h, e, k), d
    # A timed run is one program over all the sets, so each set costs a whole
    # step's outputs and temporaries: count the parameters (and so their
    # gradients) too, or MoE weights get 16 steps at once and run out of memory.
    param_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(nnx.state(pair[0][0])))
    sets = timing.rotation(t * width * 2 + param_bytes)
    inputs = [common.randn(sub, (t, width), DTYPE) for sub in jax.random.split(key, sets)]
    row = {"layer": kind, "shape": list(shape), "flops": flops, "rounds": rounds}
    outs, steps = {}, {}
    for side, (model, call) in zip(("jax_cluster", "flax"), pair):
        step, state = step_fn(model, call)
        try:
            compiled = jax.jit(step).lower(state, inputs[0]).compile()
            row[side] = footprint(compiled)
            if hlo_dir is not None:
                name = f"{kind}_{'x'.join(map(str, shape))}_{side}.hlo.txt"
                (hlo_dir / name).write_text(compiled.as_text())
            if row[side]["temp_gb"] > row[side].get("limit_gb", float("inf")):
                raise MemoryError(f"needs {row[side]['temp_gb']:.1f} GB of temporaries")
            outs[side] = jax.device_get(compiled(state, inputs[0]))
        except (jax.errors.JaxRuntimeError, MemoryError) as e:  # XLA's ragged_dot can run out
            row[side] = {**row.get(side, {}), "error": str(e).splitlines()[0][:200]}
            continue
        steps[side] = (step, state)
    # Interleaved rounds, the median per side: a card that heats up over the
    # run moves both sides alike (Flax's 4096x8192 step moved 11% between calls).
    times = {side: [] for side in steps}
    for r in range(rounds):
        for side in list(steps) if r % 2 == 0 else list(steps)[::-1]:
            try:
                ms, timer, kernels = time_step(*steps[side], inputs, iterations)
            except jax.errors.JaxRuntimeError as e:
                row[side]["error"] = str(e).splitlines()[0][:200]
                continue
            times[side].append(ms)
            row[side].update(timer=timer)
            if breakdown and kernels is not None:
                row[side]["kernels"] = kernels
    for side, ts in times.items():
        if ts and "error" not in row[side]:
            ms = statistics.median(ts)
            row[side].update(ms=ms, round_ms=ts, tflops=flops / ms / 1e9)
    if not all("ms" in row.get(side, {}) for side in ("flax", "jax_cluster")):
        return row
    ref, got = outs["flax"], outs["jax_cluster"]
    errs = [
        float(relative_error(jnp.asarray(a), jnp.asarray(b, jnp.float32)))
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref))
    ]
    row["max_rel_err_vs_flax"] = max(errs)
    row["speedup"] = row["flax"]["ms"] / row["jax_cluster"]["ms"]
    row["meets_target"] = row["speedup"] >= TARGETS[kind]
    return row


def plot(payload, path):
    rows = [r for r in payload["rows"] if "speedup" in r]
    common.plot_pairs(
        path,
        [f"{r['layer']} {'x'.join(map(str, r['shape']))}" for r in rows],
        [r["flax"]["tflops"] for r in rows],
        [r["jax_cluster"]["tflops"] for r in rows],
        baseline_label="Flax / XLA",
        ratios=[r["speedup"] for r in rows],
        ylabel="TFLOP/s (forward + backward)",
        title=f"Flax layers, {payload['device']}"
        + (" (jax_cluster autotuned)" if payload.get("plans") == "autotuned" else ""),
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_out_argument(parser)
    parser.add_argument("--quick", action="store_true", help="one small shape of each layer")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument(
        "--rounds", type=int, default=3, help="interleaved timing rounds per case; each side reports its median"
    )
    parser.add_argument("--hlo", action="store_true", help="also write each side's optimised HLO next to the results")
    parser.add_argument("--only", choices=["dense", "moe"], default=None)
    parser.add_argument(
        "--kernels", action="store_true", help="also list each side's kernels, from the timed iterations"
    )
    parser.add_argument("--dense", default=None, help="dense shapes to run instead of the default ones, e.g. 2048x2048")
    parser.add_argument(
        "--autotune",
        action="store_true",
        help="autotune each dense layer's GEMMs first; jax_cluster's side runs the winners (MoE layers are skipped)",
    )
    common.add_route_argument(parser)
    args = parser.parse_args(argv)
    common.set_route(args.route)
    dense = DENSE if args.dense is None else [tuple(int(v) for v in s.split("x")) for s in args.dense.split(",")]
    cases = (
        [("dense", (1024, 256)), ("moe", (2048, 256, 128, 8, 2))]
        if args.quick
        else ([("dense", s) for s in dense] + [("moe", s) for s in MOE])
    )
    cases = [c for c in cases if args.only in (None, c[0]) and not (args.autotune and c[0] == "moe")]
    stem = common.route_stem("layers_bf16_autotuned" if args.autotune else "layers_bf16", args.route)
    if args.autotune:
        import tempfile

        import jax_cluster

        os.environ.setdefault("JAX_CLUSTER_CACHE_DIR", tempfile.mkdtemp(prefix="jax_cluster_tune_"))
        jax_cluster.use_autotune_cache(True)
    device = common.device_name()
    out_dir = common.results_dir(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {
        "device": device,
        "jax_version": jax.__version__,
        "dtype": "bfloat16",
        "notes": [
            "step = grad of sum(out^2) w.r.t. inputs and parameters",
            f"ms = median of {args.rounds} interleaved rounds of {args.iterations} steps",
            "dense FLOPs = 3 GEMMs of 2*T*D*4D; moe FLOPs = 9 grouped GEMMs of 2*T*top_k*D*H",
        ],
        "rows": [],
    }
    payload["plans"] = "autotuned" if args.autotune else "planner"
    if args.autotune:
        payload["notes"].append(
            "jax_cluster's side runs the autotuned plan of each GEMM "
            "(jax_cluster.autotune; 'XLA dot' means XLA's dot won); "
            "each row's 'autotuned' names the winners"
        )
    print(f"{device}: {'layer':<6} {'shape':<26} {'flax ms':>9} {'ours ms':>9} {'speedup':>8} {'rel err':>9}")
    for kind, shape in cases:
        tuned = autotune_dense(*shape) if args.autotune else None
        row = bench(
            kind, shape, args.iterations, args.rounds, breakdown=args.kernels, hlo_dir=out_dir if args.hlo else None
        )
        if tuned is not None:
            row["autotuned"] = tuned
            print(
                "    autotuned: "
                + "; ".join(f"{g} {w['winner']} {w['ms']} ms (XLA {w['xla_ms']})" for g, w in tuned.items())
            )
        jax.clear_caches()  # the last case's executables and buffers must not crowd this one
        gc.collect()
        payload["rows"].append(row)
        if "speedup" not in row:
            print(
                f"{'':>{len(device) + 1}} {kind:<6} {'x'.join(map(str, shape)):<26} "
                + "; ".join(
                    f"{side}: {row[side].get('error', 'ran')} "
                    f"({row[side].get('temp_gb', 0):.1f} GB of temporaries, "
                    f"{row[side].get('kernel_calls', 0)} jax_cluster calls)"
                    for side in ("flax", "jax_cluster")
                    if side in row
                ),
                flush=True,
            )
            continue
        print(
            f"{'':>{len(device) + 1}} {kind:<6} {'x'.join(map(str, shape)):<26} "
            f"{row['flax']['ms']:9.3f} {row['jax_cluster']['ms']:9.3f} {row['speedup']:8.2f} "
            f"{row['max_rel_err_vs_flax']:9.2e}",
            flush=True,
        )
        common.write_results(out_dir, stem, payload, plot)
    for row in payload["rows"] if args.kernels else []:
        for side in ("flax", "jax_cluster"):
            listed = row.get(side, {}).get("kernels", [])
            print(
                f"{row['layer']} {'x'.join(map(str, row['shape']))} {side}: {len(listed)} kernel names, "
                f"{sum(ms for _, ms in listed):.3f} ms"
            )
            for name, ms in listed:
                print(f"    {ms:8.3f} ms  {name[:110]}")
    for kind, target in TARGETS.items():
        got = [r["speedup"] for r in payload["rows"] if r["layer"] == kind and "speedup" in r]
        if got:
            print(
                f"{kind}: target >= {target}x Flax: {'met' if min(got) >= target else 'MISSED'} (min {min(got):.2f}x)"
            )


if __name__ == "__main__":
    main()
