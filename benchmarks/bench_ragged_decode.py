"""ragged_dot at decode sizes, against its roofline and the other contenders.

At decode an MoE layer's grouped product has few rows per expert and is
memory-bound: every expert that received a row must stream its whole [K, N]
weight from HBM once. The roofline of a case is the larger of
- its compute time at the measured dense bf16 peak (XLA's dot at 8192^3), and
- the HBM time of the bytes that must move at the measured bandwidth
  (bench_matmul.hbm_bandwidth): the rows [R, K] read, the weights of the
  non-empty groups only (a group with no rows costs no weight traffic), and
  the output [R, N] written.
Both ceilings are measured in the same run. Beside them each case times a
plain read of its bytes (read_ms: the faster of XLA's column sum over that
many bf16 values and its elementwise pass over half as many, which reads and
writes the same total; rotated like the inputs): the device time any single
kernel moving those bytes took here, launch and ramp included, which the
asymptotic bandwidth leaves out at a few MiB. Each case is rows R = tokens x
top_k from 1 to 2048 spread over 8 to 256 experts (each token's top_k experts
drawn uniformly, fixed seed), with layer widths from published MoE models.

Contenders, forward only (decode): jax_cluster.ragged_dot as planned (its
tile in jc_tile_n), jax_cluster.ragged_dot pinned to each tile of
PINNED where the build has it ("jc_wide", "jc_narrow", "jc_decode2/4/8"), tokamax's
mosaic ragged_dot at its default config, and lax.ragged_dot; each checked against a
float32 per-group reference first, then timed by CUPTI with inputs rotated
past L2 (bench_ragged's helpers). Writes ragged_decode.json with rows[] of
{config, tokens, top_k, rows, experts, nonempty_groups, bytes, roofline_ms,
read_ms, read_share_of_roofline, jc_ms, jc_tile_n, jc_variant, jc_wide_ms,
jc_narrow_ms, jc_decode{2,4,8}_ms, tokamax_ms, xla_ms, jc_share_of_roofline,
jc_vs_tokamax} (a contender that cannot run records {name}_error) and a PNG.
--resume FILE keeps an earlier run's rows of the cases this run does not
measure; --contenders REGEX times only the sides it matches (the others'
fields are absent from the new rows).

--fp8: the same cases on block-scaled fp8 operands (`jax_cluster.quantize`:
rows in (1, 128) tiles, each expert's [K, N] in (128, 128) blocks, e4m3),
the weights a served model keeps in fp8. Its roofline counts one byte per
value plus the float32 scales (the output bf16) and, for compute, twice the
measured bf16 peak (the H200's fp8 tensor rate). Contenders: jax_cluster's
ragged_dot of the QArrays as planned (jc), pinned to each block-scaled
decode row of FP8_PINNED where the build has it ("jc_fp8_decode2/4/8": the
CUDA cores on the fp8 values, clusters of 2, 4 or 8 CTAs splitting K), its
bf16 path on the dequantized operands (jc_bf16: what a bf16 model runs),
tokamax's ragged_dot of the QArrays, and lax.ragged_dot on the dequantized
operands; each checked against the float32 product of the dequantized
operands. Writes ragged_decode_fp8.json.

    python benchmarks/bench_ragged_decode.py --list
    python benchmarks/bench_ragged_decode.py --out benchmarks/results/h200
    python benchmarks/bench_ragged_decode.py --smoke          # tiny shapes, any device
    python benchmarks/bench_ragged_decode.py --fp8 --out benchmarks/results/h200
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import pathlib
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import bench_matmul  # noqa: E402
import bench_ragged  # noqa: E402
import common  # noqa: E402

import jax_cluster  # noqa: E402
from jax_cluster.tuning import timing  # noqa: E402

DTYPE = jnp.bfloat16
# (name, K, N, experts, top_k): one grouped product of each layer (the gate
# or up projection; the down projection swaps K and N)
LAYERS = [
    ("mixtral-8x7b gate", 4096, 14336, 8, 2),
    ("olmoe-1b-7b gate", 2048, 1024, 64, 8),
    ("qwen3-30b-a3b gate", 2048, 768, 128, 8),
    ("qwen3-30b-a3b down", 768, 2048, 128, 8),
    ("deepseek-v3 gate", 7168, 2048, 256, 8),
]
SMOKE = [("smoke gate", 128, 64, 8, 2), ("smoke down", 64, 128, 16, 4)]
SMOKE_FP8 = [("smoke fp8 gate", 256, 128, 8, 2)]  # K and N in whole 128-value scale blocks
FP8_BLOCKS = {"lhs": (1, 128), "rhs": (128, 128)}
ROWS = (1, 8, 64, 256, 512, 2048)  # tokens x top_k
SEED = 20261203
# Rows pinned: the grouped GEMM's training tile, its decode tile whose 64-wide
# N puts more CTAs on a few groups' weights, each with fewer bytes in flight,
# and the CUDA-core decode rows, whose clusters of 2, 4 or 8 CTAs split K.
PINNED = {
    "jc_wide": {"tile": (128, 256, 64)},
    "jc_narrow": {"tile": (128, 64, 64)},
    **{f"jc_decode{c}": {"tile": (8, 256, 8), "cluster": (c, 1)} for c in (2, 4, 8)},
}
# --fp8: the block-scaled decode rows (64 columns an item, one scale block a K step)
FP8_PINNED = {f"jc_fp8_decode{c}": {"tile": (8, 64, 128), "cluster": (c, 1)} for c in (2, 4, 8)}


def case_sizes(rows: int, experts: int, top_k: int) -> np.ndarray:
    """Group sizes of rows // top_k tokens each routed to top_k distinct uniform experts."""
    tokens = max(1, rows // top_k)
    rng = np.random.default_rng(SEED + rows * 1000 + experts)
    chosen = np.argsort(rng.random((tokens, experts)), axis=1)[:, :top_k]
    return np.bincount(chosen.reshape(-1), minlength=experts).astype(np.int32)


def moved_bytes(sizes: np.ndarray, k: int, n: int, itemsize: int) -> int:
    rows = int(sizes.sum())
    return itemsize * (rows * k + int((sizes > 0).sum()) * k * n + rows * n)


def moved_bytes_fp8(sizes: np.ndarray, k: int, n: int) -> int:
    """One byte a value and a float32 scale a block, read; the output written in bf16."""
    rows, groups = int(sizes.sum()), int((sizes > 0).sum())
    values = rows * k + groups * k * n
    scales = 4 * (rows * (k // 128) + groups * (k // 128) * (n // 128))
    return values + scales + 2 * rows * n


def dense_peak_flops(iterations: int) -> float:
    """bf16 FLOP/s of XLA's dot at 8192^3 on random data, this run."""
    n = 8192
    a = common.randn(jax.random.key(1), (n, n), DTYPE)
    b = common.randn(jax.random.key(2), (n, n), DTYPE)
    return 2 * n**3 / (timing.cupti_ms(jnp.matmul, [(a, b)], iterations) * 1e-3)


def _quantized_rows(x):
    return jax_cluster.quantize(x, block=FP8_BLOCKS["lhs"])


def _quantized_experts(w):
    return jax_cluster.quantize(w, block=FP8_BLOCKS["rhs"])


def pinned_ragged_dot(m: int, n: int, k: int, experts: int, pin: dict, fp8: bool = False):
    """jax_cluster.ragged_dot pinned to the row `pin` names, or None and why
    it cannot run; `fp8`: of block-scaled QArrays, the weights [E, N, K]."""
    kw = {"dtype": "e4m3", "out_dtype": DTYPE, "b_major": "k"} if fp8 else {"dtype": DTYPE}
    try:
        plan = jax_cluster.plan_ragged(m, n, k, experts, problem="ragged_m", **kw, **pin)
    except ValueError as exc:  # the build lacks the row
        return None, str(exc)
    if plan.path != "kernel":
        return None, f"no kernel plan for {pin}: {plan.reason}"
    layout = {"rhs_layout": "gnk"} if fp8 else {}
    return functools.partial(jax_cluster.ragged_dot, plan=plan, **layout), None


READ_COLUMNS = 4096


def read_ms(nbytes: int, sets: int, iterations: int, timer) -> float:
    """Device time of the fastest plain XLA read of `nbytes` measured here:
    a column sum of that many bf16 bytes (one read, a 16 KiB write) or an
    elementwise pass over half of them (the same bytes read and written),
    each over `sets` rotated buffers."""
    itemsize = jnp.dtype(DTYPE).itemsize
    rows = max(1, nbytes // (itemsize * READ_COLUMNS))
    keys = jax.random.split(jax.random.key(rows), sets)
    whole = [(common.randn(key, (rows, READ_COLUMNS), DTYPE),) for key in keys]
    half = [(x[: max(1, rows // 2)],) for (x,) in whole]
    column_sum = timer(lambda x: jnp.sum(x, axis=0, dtype=jnp.float32), whole, iterations)
    elementwise = timer(lambda x: x + 1, half, iterations)
    return min(column_sum, elementwise)


def measure(name, k, n, experts, top_k, rows, ceilings, iterations, timer, only=".", fp8=False) -> dict:
    sizes = case_sizes(rows, experts, top_k)
    m = int(sizes.sum())
    peak, bandwidth = ceilings
    if fp8:
        peak, nbytes = 2 * peak, moved_bytes_fp8(sizes, k, n)
    else:
        nbytes = moved_bytes(sizes, k, n, jnp.dtype(DTYPE).itemsize)
    roofline_ms = max(2 * m * k * n / peak, nbytes / bandwidth) * 1e3
    row = {
        "config": name,
        "commit": common.run_record()["commit"],  # a resumed file holds rows of several runs
        "k": k,
        "n": n,
        "experts": experts,
        "top_k": top_k,
        "tokens": m // top_k,
        "rows": m,
        "nonempty_groups": int((sizes > 0).sum()),
        "bytes": nbytes,
        "roofline_ms": roofline_ms,
        "roofline_bound": "memory" if nbytes / bandwidth >= 2 * m * k * n / peak else "compute",
    }
    sets = timing.rotation(nbytes)
    row["read_ms"] = read_ms(nbytes, sets, iterations, timer)
    row["read_share_of_roofline"] = roofline_ms / row["read_ms"]
    keys = jax.random.split(jax.random.key(rows * 31 + experts), 2 * sets)
    args = [
        (common.randn(keys[2 * i], (m, k), DTYPE), common.randn(keys[2 * i + 1], (experts, k, n), DTYPE))
        for i in range(sets)
    ]
    gs = jnp.asarray(sizes)
    case = bench_ragged.Case(m, experts, k, n, "uniform", tuple(int(s) for s in sizes))
    tokamax_error = bench_ragged.tokamax_problem()
    tokamax = None if tokamax_error else bench_ragged.tokamax_ragged_dot(None)
    errors = {"tokamax": tokamax_error}
    if fp8:  # the contenders that take the QArrays, and those that take their bf16 values
        quantized = [(_quantized_rows(a), _quantized_experts(b)) for a, b in args]
        args = [tuple(jax_cluster.dequantize(q, DTYPE) for q in pair) for pair in quantized]
        # the weights as Hopper's fp8 MMA reads them, [E, N, K]: the same blocks, scales and values
        k_major = [(a, _quantized_experts(b.swapaxes(1, 2))) for (a, _), (_, b) in zip(quantized, args)]
        contenders = {"jc": (functools.partial(jax_cluster.ragged_dot, rhs_layout="gnk"), k_major)}
        for short, pin in FP8_PINNED.items():
            fn, errors[short] = pinned_ragged_dot(m, n, k, experts, pin, fp8=True)
            contenders[short] = (fn, k_major)
        contenders |= {
            "jc_bf16": (jax_cluster.ragged_dot, args),
            "tokamax": (tokamax, quantized),
            "xla": (jax.lax.ragged_dot, args),
        }
        planned = jax_cluster.plan_ragged(
            m, n, k, experts, problem="ragged_m", dtype=jnp.float8_e4m3fn, out_dtype=DTYPE, a_major="k", b_major="k"
        )
    else:
        contenders = {"jc": (jax_cluster.ragged_dot, args)}
        for short, pin in PINNED.items():
            fn, errors[short] = pinned_ragged_dot(m, n, k, experts, pin)
            contenders[short] = (fn, args)
        contenders.update(tokamax=(tokamax, args), xla=(jax.lax.ragged_dot, args))
        planned = jax_cluster.plan_ragged(m, n, k, experts, problem="ragged_m", dtype=DTYPE)
    row["jc_tile_n"] = planned.tile_n if planned.path == "kernel" else None
    row["jc_variant"] = planned.variant if planned.path == "kernel" else None
    first = {"lhs": args[0][0], "rhs": args[0][1], "dy": None}  # fp8: the dequantized values
    reference = bench_ragged.grouped_reference(case, "fwd", first)
    contenders = {short: pair for short, pair in contenders.items() if re.search(only, short)}
    for short, (ragged_dot, inputs) in contenders.items():
        row[f"{short}_ms"] = None
        if ragged_dot is None:
            row[f"{short}_error"] = errors[short]
            continue
        fn = lambda a, b, ragged_dot=ragged_dot: ragged_dot(a, b, gs)  # noqa: E731
        result = bench_ragged.check_then_time(
            lambda fn=fn, inputs=inputs: jax.jit(fn)(*inputs[0]),
            lambda fn=fn, inputs=inputs: timer(fn, inputs, iterations),
            reference,
            1,
            "cupti",
        )
        if result["status"] == "ok":
            row[f"{short}_ms"] = result["ms"]
        else:
            row[f"{short}_error"] = result["status"]
    if row.get("jc_ms"):
        row["jc_share_of_roofline"] = roofline_ms / row["jc_ms"]
        row["jc_vs_tokamax"] = row["tokamax_ms"] / row["jc_ms"] if row.get("tokamax_ms") else None
        if fp8:
            row["jc_vs_bf16"] = row["jc_bf16_ms"] / row["jc_ms"] if row.get("jc_bf16_ms") else None
    return row


def earlier_rows(path) -> dict:
    """{(config, rows): row} of an earlier run's JSON (none without one)."""
    if path is None or not path.exists():
        return {}
    return {(r["config"], r["rows"]): r for r in json.loads(path.read_text())["rows"]}


def _geomean(values):
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def summary(rows) -> dict:
    shares = [r["jc_share_of_roofline"] for r in rows if r.get("jc_share_of_roofline")]
    versus = [r["jc_vs_tokamax"] for r in rows if r.get("jc_vs_tokamax")]
    out = {
        "rows": len(rows),
        "min_share_of_roofline": min(shares, default=None),
        "cases_below_85pct_of_roofline": sum(s < 0.85 for s in shares),
        # where even a plain read of the case's bytes stays under 85% of the roofline
        "cases_a_read_keeps_below_85pct": sum(
            r["read_share_of_roofline"] < 0.85 for r in rows if r.get("read_share_of_roofline")
        ),
        "min_vs_tokamax": min(versus, default=None),
        "geomean_vs_tokamax": _geomean(versus),
    }
    over_bf16 = [r["jc_vs_bf16"] for r in rows if r.get("jc_vs_bf16")]
    if over_bf16:  # the fp8 run
        out.update(min_vs_bf16=min(over_bf16), geomean_vs_bf16=_geomean(over_bf16))
    return out


def jax_cluster_ms(row):
    """The planned call's time; in a run whose --contenders left it out, the
    fastest of the pinned jax_cluster rows timed (its bf16 path aside)."""
    if row.get("jc_ms"):
        return row["jc_ms"]
    pinned = [v for k, v in row.items() if k.startswith("jc_") and k.endswith("_ms") and k != "jc_bf16_ms" and v]
    return min(pinned, default=None)


def plot(payload, path):
    rows = payload["rows"]
    ours = [jax_cluster_ms(r) or float("nan") for r in rows]
    planned = all(r.get("jc_ms") for r in rows)
    common.plot_pairs(
        path,
        [f"{r['config']} R={r['rows']}" for r in rows],
        [r["roofline_ms"] for r in rows],
        ours,
        baseline_label="roofline",
        ours_label="jax_cluster" if planned else "jax_cluster (fastest pinned row)",
        ratios=[r["roofline_ms"] / t for r, t in zip(rows, ours)],
        ylabel="ms (device time); label: share of the roofline",
        title=f"ragged_dot at decode sizes, {payload['operands']}, {payload['device']}",
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_out_argument(parser)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="tokens x top_k per case")
    parser.add_argument("--resume", type=pathlib.Path, help="an earlier ragged_decode.json whose other cases to keep")
    parser.add_argument("--layers", default="", help="regex: only the layers whose name matches")
    parser.add_argument("--smoke", action="store_true", help="tiny layers, for any device")
    parser.add_argument(
        "--contenders", default=".", help="regex on contender names (jc, jc_wide, ..., tokamax, xla): only those run"
    )
    parser.add_argument("--list", action="store_true", help="print the cases and exit (no GPU)")
    parser.add_argument("--fp8", action="store_true", help="block-scaled e4m3 operands (ragged_decode_fp8.json)")
    args = parser.parse_args(argv)
    layers = (SMOKE_FP8 if args.fp8 else SMOKE) if args.smoke else LAYERS
    layers = [layer for layer in layers if re.search(args.layers, layer[0])]
    todo = [(layer, rows) for layer in layers for rows in map(int, args.rows.split(","))]
    # a layer's cases with the same rows (R below top_k becomes one token) run once
    todo = list({(layer[0], int(case_sizes(r, *layer[3:]).sum())): (layer, r) for layer, r in todo}.values())
    if args.list:
        for (name, k, n, experts, top_k), rows in todo:
            sizes = case_sizes(rows, experts, top_k)
            shape = f"{name:<22} K={k:<5} N={n:<6} E={experts:<4}"
            print(f"{shape} rows={int(sizes.sum()):<5} non-empty {int((sizes > 0).sum())}")
        print(f"{len(todo)} cases")
        return
    probe = jnp.ones((8,), DTYPE)
    if timing.cupti_works(probe):
        timer, ceilings = (
            timing.cupti_ms,
            (dense_peak_flops(args.iterations), bench_matmul.hbm_bandwidth(args.iterations)),
        )
    else:  # no CUPTI (a CPU): wall time against nominal ceilings, for the harness only
        timer, ceilings = timing.wall_ms, (1e12, 1e11)
    print(f"ceilings: {ceilings[0] / 1e12:.0f} TFLOP/s, {ceilings[1] / 1e12:.2f} TB/s")
    measured = {(name, int(case_sizes(r, experts, top_k).sum())) for (name, _, _, experts, top_k), r in todo}
    rows = [row for key, row in earlier_rows(args.resume).items() if key not in measured]
    order = {name: i for i, (name, *_) in enumerate(LAYERS + SMOKE + SMOKE_FP8)}
    shown = ("jc", *FP8_PINNED, "jc_bf16") if args.fp8 else ("jc", *PINNED)
    for (name, k, n, experts, top_k), r in todo:
        row = measure(name, k, n, experts, top_k, r, ceilings, args.iterations, timer, args.contenders, args.fp8)
        rows.append(row)
        rows.sort(key=lambda row: (order.get(row["config"], len(order)), row["rows"]))
        cells = " ".join(
            f"{c} {row[c + '_ms']:.4f}" if row.get(c + "_ms") else f"{c} -" for c in (*shown, "tokamax", "xla")
        )
        bounds = f"roofline {row['roofline_ms']:.4f} read {row['read_ms']:.4f} ms"
        print(f"{name:<22} rows={row['rows']:<5} {bounds} | {cells}", flush=True)
        # after every case: a run cut off by a time limit keeps what it measured
        payload = {
            "device": common.device_name(),
            "jax_version": jax.__version__,
            "commit": common.run_record()["commit"],
            "operands": "e4m3, block-scaled" if args.fp8 else "bf16",
            # fp8's compute ceiling: twice the measured bf16 peak
            "peak_flops": ceilings[0] * (2 if args.fp8 else 1),
            "bandwidth_bytes_per_s": ceilings[1],
            "timing": "cupti" if timer is timing.cupti_ms else "wall",
            "cases": f"{len(rows)} rows; this run measured {len(todo)} cases",
            "summary": summary(rows),
            "rows": rows,
        }
        name_of_file = "ragged_decode_fp8" if args.fp8 else "ragged_decode"
        common.write_results(common.results_dir(args.out), name_of_file, payload, plot)
    print(json.dumps(summary(rows), indent=1))


if __name__ == "__main__":
    main()
