"""Host cost of a jax_cluster GEMM call against XLA's dot.

A jit runs a chain of small GEMMs (a few microseconds of device time each);
it is called back to back and synced once, so the wall time per GEMM is the
dispatch cost wherever that exceeds the kernel. Device time (CUPTI) is listed
beside it. Two jax_cluster sides: the kernel's call (pinned past the routing)
and `jax_cluster.matmul` as a user writes it, on whichever path the routing
picks for the shape. XLA_FLAGS apply as given: run it again with
XLA_FLAGS=--xla_gpu_enable_command_buffer= to see XLA's command buffers' share,
with JAX_CLUSTER_COMMAND_BUFFERS=0 to keep the kernel calls out of them, and
with JAX_CLUSTER_RECORD=0 to have XLA capture them instead of recording them
as kernel nodes, and with JAX_CLUSTER_PDL=0 (or =stream) to launch the kernel
without programmatic dependent launch (or with it on stream launches only, not
on XLA's graph nodes).

    python benchmarks/bench_host_overhead.py --out benchmarks/results/h200
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import statistics
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import common  # noqa: E402

import jax_cluster  # noqa: E402
from jax_cluster.planning.dense import plan_gemm  # noqa: E402
from jax_cluster.primitives.gemm import gemm  # noqa: E402
from jax_cluster.tuning import timing  # noqa: E402
from jax_cluster.tuning.accuracy import relative_error  # noqa: E402

SIZES = (1024, 2048)
PDL_MODES = {"0": "off", "stream": "stream"}
DEFAULT_PDL_MODE = "stream_and_graph"  # JAX_CLUSTER_PDL unset


def chain(mm, length):
    def run(a, b):
        for _ in range(length):
            a = mm(a, b)
        return a

    return jax.jit(run)


def measure(n, length, rounds, schedule=None):
    ka, kb = jax.random.split(jax.random.key(n))
    # scaled so a chain of products stays O(1)
    a = (jax.random.normal(ka, (n, n), jnp.float32) / n**0.5).astype(jnp.bfloat16)
    b = (jax.random.normal(kb, (n, n), jnp.float32) / n**0.5).astype(jnp.bfloat16)
    # the kernel's call, whatever the routing would pick for this shape
    pins = {"schedule": schedule} if schedule else {}
    plan = plan_gemm(n, n, n, dtype=jnp.bfloat16, a_major="k", b_major="n", route="kernel", **pins)
    # and the call as a user writes it, on the path the routing picks
    default = plan_gemm(n, n, n, dtype=jnp.bfloat16, a_major="k", b_major="n")
    sides = {
        "jax_cluster": lambda x, y: gemm(x, y, a_major="k", b_major="n", plan=plan),
        "jax_cluster_default": jax_cluster.matmul,
        "xla": lambda x, y: x @ y,
    }
    row = {
        "size": n,
        "chain": length,
        "jax_cluster_runs": plan.variant if plan.uses_kernel else "XLA",
        "jax_cluster_default_runs": default.variant if default.uses_kernel else "XLA",
    }
    fns = {side: chain(mm, length) for side, mm in sides.items()}
    want = jnp.asarray(fns["xla"](a, b), jnp.float32)
    for side in ("jax_cluster", "jax_cluster_default"):
        err = float(relative_error(jnp.asarray(fns[side](a, b), jnp.float32), want))
        row["rel_err_vs_xla" if side == "jax_cluster" else f"{side}_rel_err_vs_xla"] = err
        if not math.isfinite(err):
            raise RuntimeError(f"{n}^3: the {side} chain produced non-finite values")
    walls = {side: [] for side in sides}
    enqueues = {side: [] for side in sides}
    for fn in fns.values():  # an untimed round: XLA builds its command buffers over the first runs
        timing.span_ms(fn, [(a, b)], calls=50)
    for r in range(rounds):  # interleaved
        for side in list(sides) if r % 2 == 0 else list(sides)[::-1]:
            enqueue, span = timing.back_to_back_ms(fns[side], [(a, b)], calls=50)
            walls[side].append(span * 1e3 / length)
            enqueues[side].append(enqueue * 1e3 / length)
    for side, fn in fns.items():
        try:
            device = timing.cupti_ms(lambda x, y, fn=fn: fn(x, y), [(a, b)], 10) * 1e3 / length
        except Exception:  # no CUPTI: the wall time stands alone
            device = None
        row[side] = {
            "wall_us": statistics.median(walls[side]),
            "rounds_us": walls[side],
            "enqueue_us": statistics.median(enqueues[side]),
            "device_us": device,
        }
    return row


def plot(payload, path):
    rows = payload["rows"]
    common.plot_pairs(
        path,
        [f"{r['size']}^3 ({r['jax_cluster_runs'].split('bf16_bf16_')[-1]})" for r in rows],
        [r["xla"]["wall_us"] for r in rows],
        [r["jax_cluster"]["wall_us"] for r in rows],
        baseline_label="XLA dot",
        ratios=[r["jax_cluster"]["wall_us"] / r["xla"]["wall_us"] for r in rows],
        ylabel="wall us per GEMM (lower is better)",
        title=f"Host cost per GEMM call, {payload['device']}, XLA_FLAGS={payload['xla_flags'] or '(none)'}",
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--chain", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--schedule", default=None, help="pin the kernel's schedule (default: the planner's)")
    args = parser.parse_args()
    flags = os.environ.get("XLA_FLAGS", "").strip()
    payload = {
        "device": common.device_name(),
        "jax_version": jax.__version__,
        "xla_flags": flags,
        # False: JAX_CLUSTER_COMMAND_BUFFERS=0, each kernel call its own thunk
        "jax_cluster_command_buffers": jax_cluster.info().command_buffers,
        # False: JAX_CLUSTER_RECORD=0, kernel calls captured into XLA's command buffers
        "jax_cluster_record_stage": jax_cluster.info().record_stage,
        # "runtime": JAX_CLUSTER_LAUNCH=runtime, kernels launched by cudaLaunchKernelExC
        "jax_cluster_launch": "runtime" if os.environ.get("JAX_CLUSTER_LAUNCH") == "runtime" else "driver",
        "jax_cluster_schedule": args.schedule or "planned",
        # where a kernel without a workspace is launched as a programmatic
        # dependent of the kernel before it: JAX_CLUSTER_PDL=0 "off", =stream
        # "stream", else "stream_and_graph"
        "jax_cluster_pdl": PDL_MODES.get(os.environ.get("JAX_CLUSTER_PDL", ""), DEFAULT_PDL_MODE),
        "notes": [
            "wall_us: median over interleaved rounds of 50 back-to-back calls of a "
            "jit holding a chain of GEMMs, synced once, per GEMM",
            "device_us: CUPTI kernel time per GEMM",
            "enqueue_us: the host's time per GEMM to dispatch the 50 calls, up to the sync; "
            "where the chain is device-bound (wall_us near device_us) this is the host cost, "
            "unless the launch queue filled and the host waited on the device",
            "jax_cluster: the kernel's call (route='kernel'); jax_cluster_default: jax_cluster.matmul "
            "as a user calls it, on the path the routing picks (jax_cluster_default_runs)",
        ],
        "rows": [],
    }
    for n in map(int, args.sizes.split(",")):
        row = measure(n, args.chain, args.rounds, args.schedule)
        payload["rows"].append(row)
        ours, xla = row["jax_cluster"], row["xla"]
        default = row["jax_cluster_default"]
        print(
            f"{n}^3 bf16 ({row['jax_cluster_runs']}): jax_cluster wall {ours['wall_us']:.2f} us "
            f"(device {ours['device_us']}, enqueue {ours['enqueue_us']:.2f}) | default call "
            f"({row['jax_cluster_default_runs']}) wall {default['wall_us']:.2f} us | XLA wall "
            f"{xla['wall_us']:.2f} us (device {xla['device_us']}, enqueue {xla['enqueue_us']:.2f}); "
            f"chain's rel err vs XLA {row['rel_err_vs_xla']:.1e}",
            flush=True,
        )
    if args.out:
        stem = common.results_stem("host_overhead_bf16", flags)
        if args.schedule:
            stem += f"_{args.schedule}"
        if payload["jax_cluster_pdl"] != DEFAULT_PDL_MODE:
            stem += f"_pdl_{payload['jax_cluster_pdl']}"
        if not payload["jax_cluster_command_buffers"]:
            stem += "_thunks"
        elif not payload["jax_cluster_record_stage"]:
            stem += "_captured"
        common.write_results(args.out, stem, payload, plot)


if __name__ == "__main__":
    main()
