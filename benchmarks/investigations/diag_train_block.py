"""Where do train_block's probes spend their time? For each side (jax_cluster's
layers, Flax's) and each probe named (the training step, or a block's forward
+ backward) as train_block times it, in one process:

  span:    wall ms per call over back-to-back calls synced once;
  device:  the sum of its kernels' durations (CUPTI) and how many ran;
  program: the compiled program's custom calls, fusions and other thunks;
  host:    µs per call to enqueue it (no sync), the Python calls one dispatch
           makes (few where jit's C++ fast path takes it) and the leaves of
           its arguments.

    python benchmarks/investigations/diag_train_block.py [--size small] [--probes step,moe_mlp]
Run it under XLA_FLAGS=--xla_gpu_enable_command_buffer= and with
JAX_CLUSTER_RECORD=0 too, to see what command buffers and the record stage change.
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import re
import statistics
import sys

import jax
import jax.numpy as jnp
from jax.experimental.mosaic.gpu import profiler

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
import train_block  # noqa: E402

from jax_cluster.tuning import timing  # noqa: E402


def probes(kind, dims):
    """train_block's timing probes after two training steps: {name: (jitted fn, args)}."""
    *_, found = train_block.train(kind, dims, jnp.bfloat16, 2)
    return {name: (jax.jit(fn), args) for name, (fn, args) in found.items()}


def program_counts(fn, args):
    text = fn.lower(*args).compile().as_text()
    ops = collections.Counter()
    for line in text.splitlines():
        if "ENTRY" in line or not re.match(r"\s*(ROOT )?%?\S+ = ", line):
            continue
        op = re.search(r"= \S+ ([a-z-]+)\(", line)
        if op:
            ops[op.group(1)] += 1
    targets = collections.Counter(re.findall(r'custom_call_target="([^"]+)"', text))
    return {k: v for k, v in ops.most_common(12)}, dict(targets)


def python_calls(fn, args, calls=10):
    """Python (and C) function calls one dispatch makes, from sys.setprofile."""
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        count += event in ("call", "c_call")

    jax.block_until_ready(fn(*args))
    sys.setprofile(profile)
    try:
        outs = [fn(*args) for _ in range(calls)]
    finally:
        sys.setprofile(None)
    jax.block_until_ready(outs)
    return count / calls


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(train_block.SIZES), default="small")
    parser.add_argument("--probes", default="step,moe_mlp")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    dims = train_block.SIZES[args.size]
    flags, record = os.environ.get("XLA_FLAGS", ""), os.environ.get("JAX_CLUSTER_RECORD", "1")
    print(f"train_block {args.size} {dims}, XLA_FLAGS={flags!r} JAX_CLUSTER_RECORD={record}")
    sides = {kind: probes(kind, dims) for kind in ("jax_cluster", "flax")}
    for name in args.probes.split(","):
        spans = {kind: [] for kind in sides}
        for r in range(args.rounds):
            for kind in list(sides) if r % 2 == 0 else list(sides)[::-1]:
                fn, a = sides[kind][name]
                spans[kind].append(timing.span_ms(fn, [a], calls=50))
        for kind in sides:
            fn, a = sides[kind][name]
            ms, kernels = timing.cupti_kernels(fn, [a], iterations=5)
            _, launches = profiler.measure(fn, aggregate=False)(*a)
            ops, targets = program_counts(fn, a)
            print(
                f"{name} {kind}: span {statistics.median(spans[kind]):.3f} ms (rounds "
                f"{[round(v, 3) for v in spans[kind]]}), device {ms * 1e3:.1f} us, "
                f"{len(launches)} kernel launches of {len(kernels)} names"
            )
            for kernel, k_ms in kernels[:8]:
                print(f"    {k_ms * 1e3:7.2f} us  {kernel[:110]}")
            enqueue_us = timing.back_to_back_ms(fn, [a], calls=50)[0] * 1e3
            print(
                f"    host: enqueue {enqueue_us:.1f} us a call, {python_calls(fn, a):.0f} Python calls a "
                f"dispatch, {len(jax.tree.leaves(a))} argument leaves"
            )
            print(f"    program: {ops}")
            print(f"    custom calls: {targets}")


if __name__ == "__main__":
    main()
