"""GroupedLinear: one linear map per group (expert), applied with ragged_dot."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jax_cluster.ops.fp8_training import Fp8Weights, check_recipe, fp8_grouped, fp8_weights
from jax_cluster.ops.gated import gated_ragged_dot, split_gate_up_blocks
from jax_cluster.ops.ragged_dot import ragged_dot as cluster_ragged_dot
from jax_cluster.primitives.activations import activation_fn

# nnx.Linear's default kernel initialiser
LINEAR_KERNEL_INIT = nnx.initializers.lecun_normal()


class GroupedLinear(nnx.Module):
    """G bias-free linear maps: rows of x [M, in], sorted by group, are
    multiplied by their group's kernel.

    `kernel` is [G, in, out]: a stack of G `nnx.Linear` kernels, each drawn
    by `kernel_init` (nnx.Linear's default) from its own key, so expert g
    initialises like a Linear(in, out) would. `group_sizes` is int32 [G], or
    [S, G] for S row blocks routed separately (see `jax_cluster.ragged_dot`).
    `ragged_dot=` swaps the product (e.g. `jax.lax.ragged_dot` as a reference,
    which takes [G] sizes only). `fp8="blockwise"` or `"mxfp8"` runs the three products
    on block-scaled fp8 operands quantized on the fly (see
    `jax_cluster.ops.fp8_training`; rows and features in multiples of 128);
    `fp8_weights()` quantizes the kernels ahead, for calls that pass it back
    (`fp8_weights=`) while the kernels keep their values.
    """

    def __init__(
        self,
        num_groups: int,
        in_features: int,
        out_features: int,
        *,
        dtype=None,
        param_dtype=jnp.float32,
        preferred_element_type=None,
        kernel_init=LINEAR_KERNEL_INIT,
        ragged_dot=cluster_ragged_dot,
        fp8: str | None = None,
        rngs: nnx.Rngs,
    ):
        check_recipe(fp8)
        self.fp8 = fp8
        keys = jax.random.split(rngs.params(), num_groups)
        self.kernel = nnx.Param(jax.vmap(lambda key: kernel_init(key, (in_features, out_features), param_dtype))(keys))
        self.num_groups, self.in_features, self.out_features = num_groups, in_features, out_features
        self.dtype, self.param_dtype = dtype, param_dtype
        self.preferred_element_type = preferred_element_type
        self.ragged_dot = ragged_dot

    def fp8_weights(self) -> Fp8Weights:
        """The kernels (in the layer's dtype, where set) quantized for the fp8
        recipe (`ops.fp8_training.fp8_weights`), for calls that pass them as
        `fp8_weights=` while the weights keep their values."""
        return fp8_weights(self.kernel[...], self.fp8, dtype=self.dtype)

    def __call__(self, x, group_sizes, group_offset=None, *, fp8_weights: Fp8Weights | None = None):
        """x [M, in] by each row's group's kernel. `group_offset` (expert
        parallelism): this layer holds the experts from it on, group_sizes
        all of them; rows of the others come out zero (ragged_dot's rule).
        `fp8_weights`: what `fp8_weights()` returned for these kernels."""
        kernel = self.kernel[...]
        # nnx.Linear's promotion: the given dtype, else the inputs' common type
        dtype = self.dtype or jnp.result_type(x, kernel)
        self._check_fp8_weights(fp8_weights)
        if self.fp8 is not None:
            args = (group_sizes, self.fp8, jnp.float8_e4m3fn, group_offset, fp8_weights)
            return fp8_grouped(x.astype(dtype), kernel.astype(dtype), *args)
        offset = {} if group_offset is None else {"group_offset": group_offset}
        return self.ragged_dot(
            x.astype(dtype),
            kernel.astype(dtype),
            group_sizes,
            preferred_element_type=self.preferred_element_type,
            **offset,
        )

    def gated(self, x, group_sizes, activation, *, fp8_weights: Fp8Weights | None = None):
        """act(gate) * up for a kernel [G, in, 2H] whose columns are gate and
        up in alternating blocks of 8 (`jax_cluster.interleave_gate_up`).
        `activation` is a name ("silu", "gelu", "gelu_exact", "relu") or a
        callable. Named, with this package's ragged_dot and no fp8 recipe,
        one grouped GEMM with the gate in its epilogue computes it
        (`jax_cluster.gated_ragged_dot`); otherwise the layer's product, then
        the gate on XLA."""
        self._check_fp8_weights(fp8_weights)
        name = activation if isinstance(activation, str) else _ACTIVATION_NAMES.get(activation)
        if name is not None and self.fp8 is None and self.ragged_dot is cluster_ragged_dot:
            kernel = self.kernel[...]
            dtype = self.dtype or jnp.result_type(x, kernel)
            return gated_ragged_dot(
                x.astype(dtype),
                kernel.astype(dtype),
                group_sizes,
                activation=name,
                preferred_element_type=self.preferred_element_type,
            )
        gate, up = split_gate_up_blocks(self(x, group_sizes, fp8_weights=fp8_weights))
        return (activation_fn(activation) if isinstance(activation, str) else activation)(gate) * up

    def _check_fp8_weights(self, fp8_weights):
        if fp8_weights is not None and self.fp8 is None:
            raise ValueError("jax_cluster.nn.GroupedLinear: fp8_weights= needs a layer made with fp8=")


# the Flax activations the gated epilogue computes, by the name the kernel knows
_ACTIVATION_NAMES = {jax.nn.silu: "silu", jax.nn.gelu: "gelu", jax.nn.relu: "relu"}
