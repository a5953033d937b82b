"""Per-step wall time of train_block's training loop, warm-up apart.

The loop syncs once a step (for the loss), as train_block's does. The first
`--warmup` steps (compilation, XLA's first command-buffer builds, the
record stage's node creation) are timed on their own; the next `--steps`
are the steady state. One JSON line per side on stdout. Run it once per
launch mode, e.g. with JAX_CLUSTER_RECORD=0, JAX_CLUSTER_PDL=stream or
XLA_FLAGS=--xla_gpu_enable_command_buffer=, since those are read per process.

    python benchmarks/investigations/train_loop_modes.py --size medium --steps 100
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
import train_block  # noqa: E402

MODE_VARIABLES = ("JAX_CLUSTER_RECORD", "JAX_CLUSTER_PDL", "JAX_CLUSTER_COMMAND_BUFFERS", "XLA_FLAGS")


def loop_ms(kind, dims, warmup, steps):
    model = train_block.Block(kind, dims, jnp.bfloat16, nnx.Rngs(0))
    graph, params, rest = nnx.split(model, nnx.Param, ...)
    optimizer = optax.adamw(3e-3)
    step = train_block.training_step(graph, rest, optimizer)
    opt_state = optimizer.init(params)
    batches = list(train_block.batches(dims, warmup + steps))
    times = []
    for tokens, targets in batches:
        start = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, tokens, targets)
        float(loss)  # one sync a step
        times.append((time.perf_counter() - start) * 1e3)
    steady = times[warmup:]
    return {
        "side": kind,
        "first_step_ms": times[0],
        "warmup_steps_ms": times[1:warmup],
        "steady_median_ms": statistics.median(steady),
        "steady_mean_ms": statistics.fmean(steady),
        "steady_min_ms": min(steady),
        "steady_max_ms": max(steady),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(train_block.SIZES), default="medium")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--sides", default="jax_cluster,flax")
    args = parser.parse_args()
    mode = {name: os.environ[name] for name in MODE_VARIABLES if name in os.environ}
    for kind in args.sides.split(","):
        row = loop_ms(kind, train_block.SIZES[args.size], args.warmup, args.steps)
        print(json.dumps({"size": args.size, "mode": mode, "device": jax.devices()[0].device_kind, **row}), flush=True)


if __name__ == "__main__":
    main()
