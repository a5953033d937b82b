"""nnx.Linear on jax_cluster: the product and the bias (and an optional
activation) in one fused kernel; under differentiation with an activation,
a plain GEMM and one XLA pass (see jax_cluster.linear)."""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from jax_cluster.ops.dense import dot_general as cluster_dot_general
from jax_cluster.ops.fp8_training import Fp8Weights, check_recipe, fp8_linear, fp8_weights
from jax_cluster.ops.linear import linear
from jax_cluster.ops.precision import check_precision, needs_xla
from jax_cluster.primitives.activations import activation_fn


class Linear(nnx.Linear):
    """Drop-in for `flax.nnx.Linear`: the same arguments, parameters
    (`kernel` [in, out], `bias` [out]), initialisers and dtype promotion, so
    state dicts interchange both ways.

    With the default `dot_general`, the product, the bias and `activation`
    ("none", "relu", "gelu", "gelu_exact", "silu"; not a Flax argument) run as
    one `jax_cluster.linear` kernel with a fused epilogue. Any other
    `dot_general`, an `out_sharding`, a `preferred_element_type` or a
    `precision` for inputs wider than 16 bits takes Flax's own path (the
    activation then runs after it).

    `fp8="blockwise"` (DeepSeek-V3's 1x128 / 128x128 blocks) or `"mxfp8"`
    (e8m0 scales per 32 values) runs the forward product and both backward
    products on block-scaled fp8 operands quantized on the fly
    (`jax_cluster.ops.fp8_training`; rows and features in multiples of 128);
    the parameters stay as they are. `fp8_weights()` quantizes the kernel
    ahead, for calls that pass it back (`fp8_weights=`): the micro-batches of
    a step then share one quantization of the weights.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        activation: str = "none",
        fp8: str | None = None,
        dot_general=cluster_dot_general,
        **kwargs,
    ):
        activation_fn(activation)  # an unknown name fails here, not at the first call
        check_recipe(fp8)
        super().__init__(in_features, out_features, dot_general=dot_general, **kwargs)
        self.activation, self.fp8 = activation, fp8

    def fp8_weights(self) -> Fp8Weights:
        """The kernel (in the layer's dtype, where set) quantized for the fp8
        recipe (`ops.fp8_training.fp8_weights`), for calls that pass them as
        `fp8_weights=` while the weights keep their values."""
        return fp8_weights(self.kernel[...], self.fp8, dtype=self.dtype)

    def __call__(self, inputs, out_sharding=None, *, fp8_weights: Fp8Weights | None = None):
        kernel = self.kernel[...]
        bias = self.bias[...] if self.bias is not None else None
        promoted, kernel, bias = self.promote_dtype((inputs, kernel, bias), dtype=self.dtype)
        if fp8_weights is not None and self.fp8 is None:
            raise ValueError("jax_cluster.nn.Linear: fp8_weights= needs a layer made with fp8=")
        if self.fp8 is not None:
            y = fp8_linear(promoted, kernel, self.fp8, jnp.float8_e4m3fn, fp8_weights)
            return activation_fn(self.activation)(y if bias is None else y + bias)
        if (
            self.dot_general is not cluster_dot_general
            or out_sharding is not None
            or getattr(self, "preferred_element_type", None) is not None
            or needs_xla(self.precision, promoted.dtype)
        ):
            return activation_fn(self.activation)(super().__call__(inputs, out_sharding=out_sharding))
        check_precision("jax_cluster.nn.Linear", self.precision)
        return linear(promoted, kernel, bias, activation=self.activation)
