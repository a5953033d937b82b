"""Public grouped GEMM: `ragged_dot`, with jax.lax.ragged_dot's semantics."""

from __future__ import annotations

import jax.numpy as jnp

from jax_cluster.planning.plan import Plan
from jax_cluster.primitives.ragged import ragged

_B_MAJOR = {"gkn": "n", "gnk": "k"}


def ragged_dot(
    lhs, rhs, group_sizes, *, preferred_element_type=None, rhs_layout: str = "gkn", plan: Plan | None = None
):
    """Grouped GEMM: rows of `lhs` [M,K] split into G consecutive groups, and
    group g multiplied by its own matrix rhs[g].

    rhs is [G,K,N] (`rhs_layout="gkn"`, as in `jax.lax.ragged_dot`) or
    [G,N,K] (`"gnk"`, read in place: no transpose is made). `group_sizes` is
    an int32 [G] array that stays on the device: nothing waits for its values,
    so the call works under jit and in CUDA graphs. The output is [M,N] in
    `preferred_element_type` (default: the input dtype); accumulation is fp32.
    Mixed input dtypes promote.

    `group_sizes` may also be [S,G]: the M rows are then S equal blocks, block
    s grouped by group_sizes[s] (each block as if it were its own call). This
    is the data-parallel form: with lhs rows and group_sizes sharded on the
    same mesh axes under jit, each device runs only its own blocks, rhs is
    replicated, and the weight gradient is summed over the shards.

    Group sizes: group g covers rows [min(s_g, M), min(s_g + max(size_g, 0), M)),
    where s_g is the sum of max(size, 0) over the groups before it. So a
    negative size counts as 0, groups are cut at M (sum > M never reads or
    writes out of bounds) and rows past the last group are zero. The kernel
    and the XLA fallback follow the same rule.

    Differentiable in lhs and rhs: d_lhs is the same grouped product with
    rhs read transposed in place, d_rhs[g] = lhs_g^T dy_g. vmap runs a loop
    over the mapped axis. Bf16/fp16 inputs on sm90a run the grouped kernel
    when `jax_cluster.plan_ragged` picks one; all else runs
    `jax.lax.ragged_dot_general`. `plan` pins the choice; it must be made for
    this call: plan_ragged(M, N, K, G, problem="ragged_m", b_major="n" for
    "gkn" or "k" for "gnk", ...).
    """
    if rhs_layout not in _B_MAJOR:
        raise ValueError(
            f"jax_cluster.ragged_dot: rhs_layout must be 'gkn' ([G,K,N]) or 'gnk' ([G,N,K]), got {rhs_layout!r}"
        )
    lhs, rhs, group_sizes = jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(group_sizes)
    dtype = jnp.result_type(lhs, rhs)
    return ragged(
        lhs.astype(dtype),
        rhs.astype(dtype),
        group_sizes,
        problem="ragged_m",
        b_major=_B_MAJOR[rhs_layout],
        out_dtype=preferred_element_type,
        plan=plan,
    )
