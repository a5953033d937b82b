"""nnx.Linear computing through jax_cluster.dot_general."""
from __future__ import annotations

from flax import nnx

from jax_cluster.api import dot_general as cluster_dot_general


class Linear(nnx.Linear):
    """Drop-in for `flax.nnx.Linear`: the same arguments, parameters
    (`kernel` [in, out], `bias` [out]), initialisers and dtype promotion, so
    state dicts interchange both ways. Only the default `dot_general` differs:
    the product runs on jax_cluster's kernel (XLA's dot where none applies).
    """

    def __init__(self, in_features: int, out_features: int, *,
                 dot_general=cluster_dot_general, **kwargs):
        super().__init__(in_features, out_features, dot_general=dot_general, **kwargs)
