"""The fp8 recipe's weight quantization: a stack of expert weights (or one
dense weight) in 128 x 128 blocks, written as stored and transposed (the two
layouts the block-scaled kernels read: the input gradient contracts N, the
forward K), in one process:

jc: jax_cluster's one-pass kernel (primitives/weight_block_quantize.py,
  `use_kernel=True`): one read of w, two fp8 bytes written per value.
xla: the same primitive's XLA form (an amax reduction and a scaling pass per
  layout), which the recipe takes where the kernel is not the default.
qwix: one `jax_cluster.quantize` call (qwix) and a transpose of its fp8
  values, what the recipe did before it had the primitive.

The kernel's values and scales are checked bitwise against the XLA form's
on every case first (where no kernel runs, the case records why). floor_ms: one read of w and the two fp8 copies at
--hbm-tbs (TB/s; 4.8 is the H200's HBM3e); jc_fraction_of_hbm = floor_ms /
jc_ms. Device time from CUPTI; inputs rotate past L2. Writes
fp8_weights.json (rows[] with the shape and jc_ms, xla_ms, qwix_ms, floor_ms)
and a PNG.

    python benchmarks/bench_fp8_weights.py --out benchmarks/results/h200
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import bench_ragged  # noqa: E402
import common  # noqa: E402

from jax_cluster import _ffi  # noqa: E402
from jax_cluster.ops.quantize import WEIGHT_BLOCK, quantize  # noqa: E402
from jax_cluster.primitives.weight_block_quantize import quantize_weight_blocks  # noqa: E402
from jax_cluster.tuning import timing  # noqa: E402

E4M3 = jnp.float8_e4m3fn
# (name, groups, K, N): MoE expert stacks [G, K, N] and dense weights (G = 1)
SHAPES = [
    ("Mixtral 8x7B gate", 8, 4096, 14336),
    ("Mixtral 8x7B down", 8, 14336, 4096),
    ("Mixtral 8x22B gate", 8, 6144, 16384),
    ("DeepSeek-V3 gate", 256, 7168, 2048),
    ("DeepSeek-V3 down", 256, 2048, 7168),
    ("Qwen3-30B-A3B gate", 128, 2048, 768),
    ("OLMoE gate", 64, 2048, 1024),
    ("Llama 3 8B up", 1, 4096, 14336),
    ("Llama 3 70B up", 1, 8192, 28672),
]
SMOKE_SHAPES = [("smoke", 2, 256, 384)]


def kernel(w):
    return quantize_weight_blocks(w, E4M3, use_kernel=True)


def xla_form(w):
    return quantize_weight_blocks(w, E4M3, use_kernel=False)


def through_qwix(w):
    q = quantize(w, block=WEIGHT_BLOCK)
    return q.qvalue, q.qvalue.transpose(0, 2, 1), q.scale


def bitwise_equal(a, b) -> bool:
    return all(
        np.array_equal(np.asarray(x).view(np.uint8), np.asarray(y).view(np.uint8)) for x, y in zip(a, b, strict=True)
    )


def measure(name, groups, k, n, dtype, hbm_tbs, timer, iterations) -> dict:
    row = {"model": name, "groups": groups, "k": k, "n": n, "dtype": jnp.dtype(dtype).name}
    in_bytes = groups * k * n * jnp.dtype(dtype).itemsize
    row["floor_ms"] = (in_bytes + 2 * groups * k * n) / (hbm_tbs * 1e12) * 1e3
    keys = jax.random.split(jax.random.key(groups + k + n), timing.rotation(in_bytes))
    args = [(common.randn(key, (groups, k, n), dtype),) for key in keys]
    if _ffi.register_targets():
        same = bitwise_equal(jax.jit(kernel)(*args[0]), jax.jit(xla_form)(*args[0]))
        row["jc_bitwise_equal_to_xla"] = same
        if same:
            row["jc_ms"] = timer(kernel, args, iterations)
        else:
            row["jc_error"] = "wrong: differs from the XLA form"
    else:
        row["jc_error"] = f"no kernel: {_ffi.why_no_kernels()}"
    for key, fn in (("xla", xla_form), ("qwix", through_qwix)):
        try:
            row[f"{key}_ms"] = timer(fn, args, iterations)
        except Exception as e:  # a contender that cannot run records why
            row[f"{key}_error"] = bench_ragged.brief(e)
    if row.get("jc_ms"):
        row["jc_fraction_of_hbm"] = row["floor_ms"] / row["jc_ms"]
        for key in ("xla", "qwix"):
            if row.get(f"{key}_ms"):
                row[f"jc_vs_{key}"] = row[f"{key}_ms"] / row["jc_ms"]
    return row


def summary(rows) -> dict:
    fractions = [r["jc_fraction_of_hbm"] for r in rows if "jc_fraction_of_hbm" in r]
    return {
        "geomean_jc_vs_xla": bench_ragged.geomean(r.get("jc_vs_xla") for r in rows),
        "geomean_jc_vs_qwix": bench_ragged.geomean(r.get("jc_vs_qwix") for r in rows),
        "min_jc_fraction_of_hbm": min(fractions, default=None),
        "all_bitwise_equal": all(r.get("jc_bitwise_equal_to_xla", False) for r in rows),
    }


def plot(payload, path):
    rows = [r for r in payload["rows"] if r.get("jc_ms") and r.get("xla_ms")]
    common.plot_pairs(
        path,
        [f"{r['model']} {r['groups']}x{r['k']}x{r['n']}" for r in rows],
        [r["xla_ms"] for r in rows],
        [r["jc_ms"] for r in rows],
        baseline_label="XLA form (amax + a scaling pass per layout)",
        ours_label="jax_cluster one-pass kernel",
        ratios=[r["jc_vs_xla"] for r in rows],
        ylabel="ms (device time); label: XLA / kernel",
        title=f"fp8 weight quantization, both layouts, {payload['rows'][0]['dtype']} -> e4m3, {payload['device']}",
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_out_argument(parser)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="the weights' dtype")
    parser.add_argument("--hbm-tbs", type=float, default=4.8, help="HBM bandwidth for the floor, TB/s")
    parser.add_argument("--models", default="", help="comma-separated substrings of the shapes' names (default: all)")
    parser.add_argument("--smoke", action="store_true", help="one tiny shape, for any device")
    args = parser.parse_args(argv)
    wanted = [w for w in args.models.split(",") if w]
    shapes = SMOKE_SHAPES if args.smoke else [s for s in SHAPES if not wanted or any(w in s[0] for w in wanted)]
    timer = timing.cupti_ms if timing.cupti_works(jnp.zeros(8)) else timing.wall_ms
    rows = []
    for shape in shapes:
        rows.append(measure(*shape, jnp.dtype(args.dtype), args.hbm_tbs, timer, args.iterations))
        print(json.dumps(rows[-1]), flush=True)
        payload = {
            "device": common.device_name(),
            "jax_version": jax.__version__,
            "commit": common.run_record()["commit"],
            "timing": "CUPTI kernel time" if timer is timing.cupti_ms else "wall time (no CUPTI)",
            "summary": summary(rows),
            "rows": rows,
        }
        stem = "fp8_weights" if args.dtype == "bfloat16" else f"fp8_weights_{args.dtype}"
        common.write_results(common.results_dir(args.out), stem, payload, plot)
    print(json.dumps(payload["summary"], indent=1))


if __name__ == "__main__":
    main()
