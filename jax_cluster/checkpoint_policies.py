"""Remat policies that treat jax_cluster's products as JAX's treat dot_general.

`jax.checkpoint_policies.dots_saveable` and `dots_with_no_batch_dims_saveable`
recognise `lax.dot_general` by its primitive, so under them the output of a
jax_cluster product (a kernel call, or a call the routing sends to XLA's dot
inside the primitive) is not saved: the backward pass recomputes it, one more
forward GEMM for every product whose output the backward reads (a two-layer
MLP: 7 GEMMs a step instead of 6). These policies save those outputs as
JAX's save a dot's, and are JAX's own for everything else:

    jax.checkpoint(f, policy=jax_cluster.checkpoint_policies.dots_saveable)
    nnx.remat(f, policy=jax_cluster.checkpoint_policies.dots_with_no_batch_dims_saveable)

Grouped products (`ragged_dot`, `gated_ragged_dot`, their fp8 forms) count
as dots without batch dimensions; JAX's policies save no `lax.ragged_dot`.
Name-based policies (`save_only_these_names` with `checkpoint_name`) see
every value alike and need nothing from here.
"""

from __future__ import annotations

import jax

from jax_cluster.primitives.epilogue import gemm_epilogue_p
from jax_cluster.primitives.gated import gated_ragged_p
from jax_cluster.primitives.gemm import gemm_p
from jax_cluster.primitives.ragged import ragged_dot_p
from jax_cluster.primitives.scaled_gemm import scaled_gemm_p
from jax_cluster.primitives.scaled_ragged import scaled_ragged_p

PRODUCTS = frozenset({gemm_p, gemm_epilogue_p, ragged_dot_p, gated_ragged_p, scaled_gemm_p, scaled_ragged_p})


def dots_saveable(prim, *avals, **params) -> bool:
    """Saves every product's output: jax_cluster's, lax.dot_general's and convolutions'."""
    return prim in PRODUCTS or jax.checkpoint_policies.dots_saveable(prim, *avals, **params)


def dots_with_no_batch_dims_saveable(prim, *avals, **params) -> bool:
    """Saves the outputs of products without batch dimensions (a dense GEMM
    of rank-2 operands, every grouped product), as JAX's policy of that name
    does for lax.dot_general."""
    if prim is gemm_p:
        return avals[0].ndim == 2  # rank 3: a leading batch
    return prim in PRODUCTS or jax.checkpoint_policies.dots_with_no_batch_dims_saveable(prim, *avals, **params)
