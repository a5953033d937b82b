"""Where a decode-size ragged_dot spends its device time: run it under Nsight
Compute, which lists every kernel the call launches (the group-array build,
the zeroing of uncovered rows, the grouped GEMM) with its duration.

    ncu --metrics gpu__time_duration.sum --csv \
        python benchmarks/investigations/decode_kernels.py --k 2048 --n 768 --experts 128 --rows 8

Each tile of --tiles runs --calls times after one warm-up call, planned
(no tile) first. The printed marker lines separate the cases in ncu's list.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import jax_cluster


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, default=2048)
    parser.add_argument("--n", type=int, default=768)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--rows", type=int, default=8, help="rows, one per expert from the first on")
    parser.add_argument("--tiles", default="planned,128x256x64,128x64x64")
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args(argv)
    sizes = np.zeros(args.experts, np.int32)
    np.add.at(sizes, np.arange(args.rows) % args.experts, 1)
    lhs = jax.random.normal(jax.random.key(0), (args.rows, args.k), jnp.bfloat16)
    rhs = jax.random.normal(jax.random.key(1), (args.experts, args.k, args.n), jnp.bfloat16)
    gs = jnp.asarray(sizes)
    for tile in args.tiles.split(","):
        pin = {} if tile == "planned" else {"tile": tuple(map(int, tile.split("x")))}
        plan = jax_cluster.plan_ragged(
            args.rows, args.n, args.k, args.experts, problem="ragged_m", dtype=jnp.bfloat16, **pin
        )
        fn = jax.jit(lambda a, b, g, plan=plan: jax_cluster.ragged_dot(a, b, g, plan=plan))
        fn(lhs, rhs, gs).block_until_ready()
        print(f"== {tile}: {plan.variant or plan.path}, {args.calls} calls", flush=True)
        for _ in range(args.calls):
            fn(lhs, rhs, gs).block_until_ready()


if __name__ == "__main__":
    main()
