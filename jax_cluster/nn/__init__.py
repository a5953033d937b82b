"""Flax layers on jax_cluster's kernels (needs flax: `pip install jax_cluster[nn]`).

`Linear` (nnx) and `Dense` (linen) are Flax's own layers with
`jax_cluster.dot_general` injected, so parameters, initialisers and
checkpoints are Flax's. `GroupedLinear` holds G expert kernels [G,K,N] and
applies them with `jax_cluster.ragged_dot`; `MoEMLP` routes tokens to them.
An fp8 layer's `fp8_weights()` (an `Fp8Weights`) is its kernels quantized
ahead, for calls that pass it back. Under `nnx.remat` with a dots policy,
take `jax_cluster.checkpoint_policies`' (JAX's own recompute these layers'
products).
"""

from jax_cluster.nn.dense import Dense
from jax_cluster.nn.grouped import GroupedLinear
from jax_cluster.nn.linear import Linear
from jax_cluster.nn.moe import MoEMLP, join_gate_up, route, split_gate_up
from jax_cluster.ops.fp8_training import Fp8Weights

__all__ = ["Dense", "Fp8Weights", "GroupedLinear", "Linear", "MoEMLP", "join_gate_up", "route", "split_gate_up"]
