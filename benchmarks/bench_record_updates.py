"""Record-stage updates per call of a chain of recorded GEMMs, and the host time per dispatch.

A jit of 32 chained kernel calls (route="kernel") inside XLA's command buffers,
called 50 times: the record stage's counters per call (nodes XLA asked to
update, and calls whose launches were kept from an earlier call with the same
buffers), the host time to dispatch the 50 calls per GEMM, and the wall time
once synced. With keep_outputs=True every call's output stays alive, so XLA
gives each call new buffers; otherwise they move between a few addresses.

    python benchmarks/bench_record_updates.py
"""

import pathlib
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import bench_host_overhead  # noqa: E402

from jax_cluster import _ffi  # noqa: E402
from jax_cluster.planning.dense import plan_gemm  # noqa: E402
from jax_cluster.primitives.gemm import gemm  # noqa: E402

CHAIN, CALLS = 32, 50


def main():
    for n in bench_host_overhead.SIZES:
        plan = plan_gemm(n, n, n, dtype=jnp.bfloat16, a_major="k", b_major="n", route="kernel")
        f = bench_host_overhead.chain(lambda x, y, plan=plan: gemm(x, y, a_major="k", b_major="n", plan=plan), CHAIN)
        a = (jax.random.normal(jax.random.key(0), (n, n)) / n**0.5).astype(jnp.bfloat16)
        b = (jax.random.normal(jax.random.key(1), (n, n)) / n**0.5).astype(jnp.bfloat16)
        for _ in range(5):
            f(a, b).block_until_ready()
        for keep in (False, True):
            c0 = _ffi.record_counts()
            outs = []
            t0 = time.perf_counter()
            for _ in range(CALLS):
                o = f(a, b)
                if keep:
                    outs.append(o)  # outputs kept alive: each call gets a fresh output buffer
            t1 = time.perf_counter()
            o.block_until_ready()
            t2 = time.perf_counter()
            c1 = _ffi.record_counts()
            per_call = {k: (c1[k] - c0[k]) / CALLS for k in c0}
            print(
                f"{n}^3 keep_outputs={keep}: per call {per_call}; "
                f"dispatch {1e6 * (t1 - t0) / CALLS / CHAIN:.2f} us/GEMM, "
                f"wall {1e6 * (t2 - t0) / CALLS / CHAIN:.2f} us/GEMM",
                flush=True,
            )
            del outs


if __name__ == "__main__":
    main()
