"""linen.Dense computing through jax_cluster.dot_general."""
from __future__ import annotations

from typing import Any

from flax import linen

from jax_cluster.api import dot_general as cluster_dot_general


class Dense(linen.Dense):
    """Drop-in for `flax.linen.Dense`: the same fields and the same params
    tree ({'kernel': [in, out], 'bias': [out]}); only the default
    `dot_general` is jax_cluster's."""

    dot_general: Any = cluster_dot_general
