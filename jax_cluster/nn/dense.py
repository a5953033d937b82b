"""linen.Dense on jax_cluster: the product and the bias (and an optional
activation) in one fused kernel; under differentiation with an activation,
a plain GEMM and one XLA pass (see jax_cluster.linear)."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import linen
from jax import lax

from jax_cluster.ops.dense import dot_general as cluster_dot_general
from jax_cluster.ops.linear import linear
from jax_cluster.ops.precision import check_precision, needs_xla
from jax_cluster.primitives.activations import activation_fn


class Dense(linen.Dense):
    """Drop-in for `flax.linen.Dense`: the same fields and the same params
    tree ({'kernel': [in, out], 'bias': [out]}). With the default
    `dot_general`, the product, the bias and `activation` (a field Flax does
    not have; "none" by default) run as one `jax_cluster.linear` kernel; any
    other `dot_general` or `dot_general_cls`, or a `precision` for inputs
    wider than 16 bits, computes as Flax does."""

    dot_general: Any = cluster_dot_general
    activation: str = "none"

    @linen.compact
    def __call__(self, inputs):
        kernel = self.param("kernel", self.kernel_init, (jnp.shape(inputs)[-1], self.features), self.param_dtype)
        bias = self.param("bias", self.bias_init, (self.features,), self.param_dtype) if self.use_bias else None
        inputs, kernel, bias = self.promote_dtype(inputs, kernel, bias, dtype=self.dtype)
        act = activation_fn(self.activation)
        if (
            self.dot_general_cls is None
            and self.dot_general is cluster_dot_general
            and not needs_xla(self.precision, inputs.dtype)
        ):
            check_precision("jax_cluster.nn.Dense", self.precision)
            return linear(inputs, kernel, bias, activation=self.activation)
        product = self.dot_general_cls() if self.dot_general_cls is not None else self.dot_general or lax.dot_general
        y = product(inputs, kernel, (((inputs.ndim - 1,), (0,)), ((), ())), precision=self.precision)
        return act(y if bias is None else y + bias)
