"""A mixture-of-experts MLP: top-k routing, tokens sorted by expert, three
grouped products (gate, up, down), then unsorted and combined."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jax_cluster.nn.grouped import GroupedLinear
from jax_cluster.nn.linear import Linear
from jax_cluster.ops.dense import dot_general as cluster_dot_general
from jax_cluster.ops.fp8_training import Fp8Weights
from jax_cluster.ops.gated import interleave_gate_up, split_gate_up_blocks
from jax_cluster.ops.ragged_dot import ragged_dot as cluster_ragged_dot
from jax_cluster.planning.tables import GATE_BLOCK


def route(logits, top_k: int):
    """Top-k routing of tokens by their router logits [T, E].

    Returns (order, weights, group_sizes): `order` [T*top_k] lists the
    (token, slot) pairs, flattened as token*top_k + slot, sorted by expert;
    `weights` [T*top_k] are the softmax over each token's top_k logits in the
    same flattened order; `group_sizes` int32 [E] counts each expert's rows.
    """
    num_experts = logits.shape[-1]
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"route: top_k must be in [1, {num_experts}], got {top_k}")
    # a stable sort, not lax.top_k: XLA's TopK custom call gathers a sharded
    # token axis; the sort partitions along it and breaks ties the same way
    experts = jnp.argsort(-logits, axis=-1, stable=True)[..., :top_k]
    top_logits = jnp.take_along_axis(logits, experts, axis=-1)
    weights = jax.nn.softmax(top_logits.astype(jnp.float32), axis=-1).reshape(-1)
    experts = experts.reshape(-1)
    order = jnp.argsort(experts, stable=True)
    group_sizes = jnp.bincount(experts, length=num_experts).astype(jnp.int32)
    return order, weights, group_sizes


class MoEMLP(nnx.Module):
    """y = sum over a token's top_k experts e of w_e * down_e(act(gate_e(x)) * up_e(x)).

    `token_blocks` S > 1 routes each of S equal blocks of tokens on its own
    and passes [S, E] group sizes: with the tokens sharded S ways, every
    device sorts and multiplies only its own tokens (data parallel). The
    router is a bias-free Linear; `dot_general=` and `ragged_dot=` swap the
    products (Flax's and XLA's own give a reference; lax.ragged_dot needs
    token_blocks=1).

    `fuse_gate_up=True` keeps gate and up as one [E, D, 2H] kernel `gate_up`
    (gate and up columns in alternating blocks of 8; H a multiple of 8) and
    runs them as one grouped product whose epilogue writes act(gate) * up
    (`GroupedLinear.gated`, `jax_cluster.gated_ragged_dot`): the rows are
    read once, the [T, 2H] pre-activation is never written outside
    differentiation, and the backward has one input-gradient product (K =
    2H) and one weight-gradient product instead of two each. The result is
    the same function; the parameters are laid out differently
    (`split_gate_up` / `join_gate_up` convert). Measured on the H200 with the
    gate on XLA, forward + backward, it paid for narrow experts (1.01-1.04x
    the layer up to H = 2880) and not for wide ones (0.95-1.00x at H =
    10752-16384).

    `fp8="blockwise"` or `"mxfp8"` runs the experts' products in that fp8
    recipe (`GroupedLinear`); the router stays in the layer's dtype.
    `fp8_weights()` quantizes the experts' kernels ahead, for calls that pass
    it back (`fp8_weights=`): micro-batches accumulated in one step then
    share one quantization of the weights instead of making their own.
    """

    def __init__(
        self,
        features: int,
        hidden: int,
        num_experts: int,
        top_k: int,
        *,
        token_blocks: int = 1,
        fuse_gate_up: bool = False,
        fp8: str | None = None,
        activation=nnx.silu,
        dtype=None,
        param_dtype=jnp.float32,
        dot_general=cluster_dot_general,
        ragged_dot=cluster_ragged_dot,
        rngs: nnx.Rngs,
    ):
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"MoEMLP: top_k must be in [1, {num_experts}], got {top_k}")
        self.top_k, self.token_blocks, self.activation = top_k, token_blocks, activation
        self.fuse_gate_up = fuse_gate_up
        self.router = Linear(
            features,
            num_experts,
            use_bias=False,
            dtype=dtype,
            param_dtype=param_dtype,
            dot_general=dot_general,
            rngs=rngs,
        )
        grouped = functools.partial(
            GroupedLinear,
            num_experts,
            dtype=dtype,
            param_dtype=param_dtype,
            ragged_dot=ragged_dot,
            fp8=fp8,
            rngs=rngs,
        )
        if fuse_gate_up:  # lecun_normal depends on fan-in only: each half inits like a separate kernel
            if hidden % GATE_BLOCK:
                raise ValueError(f"MoEMLP: fuse_gate_up needs hidden a multiple of {GATE_BLOCK}, got {hidden}")
            self.gate_up = grouped(features, 2 * hidden)
        else:
            self.gate = grouped(features, hidden)
            self.up = grouped(features, hidden)
        self.down = grouped(hidden, features)

    def _experts(self) -> tuple[str, ...]:
        return ("gate_up", "down") if self.fuse_gate_up else ("gate", "up", "down")

    def fp8_weights(self) -> dict[str, Fp8Weights]:
        """Each expert product's kernels quantized for the fp8 recipe
        (`GroupedLinear.fp8_weights`), by the product's name, for calls that
        pass them as `fp8_weights=` while the kernels keep their values."""
        return {name: getattr(self, name).fp8_weights() for name in self._experts()}

    def __call__(self, x, *, fp8_weights: dict[str, Fp8Weights] | None = None):
        """`fp8_weights`: what `fp8_weights()` returned for these kernels."""
        features = x.shape[-1]
        tokens = x.reshape(-1, features)
        blocks = self.token_blocks
        if tokens.shape[0] % blocks:
            raise ValueError(f"MoEMLP: {tokens.shape[0]} tokens do not split into {blocks} token_blocks")
        per_block = tokens.shape[0] // blocks
        logits = self.router(tokens).reshape(blocks, per_block, -1)
        order, weights, sizes = jax.vmap(functools.partial(route, top_k=self.top_k))(logits)
        routed = self.routed(
            tokens.reshape(blocks, per_block, features), order, weights, sizes, fp8_weights=fp8_weights
        )
        return routed.reshape(x.shape)

    def routed(self, tokens, order, weights, sizes, *, fp8_weights: dict[str, Fp8Weights] | None = None):
        """The experts' part for tokens already routed: `tokens` [S, T, D] in S
        blocks, and per block what `route` gives (`order` and `weights`
        [S, T*top_k], `sizes` [S, E]). Returns [S, T, D]. Each block's
        `order` is a permutation of its T*top_k slots, as route's is; the
        layer uses the inverse of argsort(order), which is `order` then and a
        permutation always, so its gathers never read out of bounds or break
        their promise of unique indices."""
        blocks, per_block, features = tokens.shape
        unsort = jnp.argsort(order, axis=-1)  # each slot's row
        # each token once per slot, then the slots in expert order
        slots = jnp.broadcast_to(tokens[:, :, None, :], (blocks, per_block, self.top_k, features))
        rows = _permute_rows(slots.reshape(blocks, per_block * self.top_k, features), _inverse(unsort))
        rows = rows.reshape(-1, features)  # [S*T*top_k, D], sorted
        sizes = sizes if blocks > 1 else sizes[0]
        ahead = self._fp8_weights_by_product(fp8_weights)
        if self.fuse_gate_up:
            hidden = self.gate_up.gated(rows, sizes, self.activation, fp8_weights=ahead["gate_up"])
        else:
            gate = self.gate(rows, sizes, fp8_weights=ahead["gate"])
            hidden = self.activation(gate) * self.up(rows, sizes, fp8_weights=ahead["up"])
        out = self.down(hidden, sizes, fp8_weights=ahead["down"]).reshape(blocks, per_block * self.top_k, features)
        # back to (token, slot) order, then each token's weighted sum over its slots
        unsorted = _permute_rows(out, unsort)
        return (
            unsorted.reshape(blocks, per_block, self.top_k, features)
            * weights.reshape(blocks, per_block, self.top_k, 1).astype(out.dtype)
        ).sum(2)

    def _fp8_weights_by_product(self, fp8_weights) -> dict:
        names = self._experts()
        if fp8_weights is None:
            return dict.fromkeys(names)
        if not isinstance(fp8_weights, dict) or set(fp8_weights) != set(names):
            raise ValueError(
                f"MoEMLP: fp8_weights must be what fp8_weights() returns, a dict of {names}, "
                f"got {sorted(fp8_weights) if isinstance(fp8_weights, dict) else type(fp8_weights).__name__}"
            )
        return fp8_weights


def _permute_rows(x, index):
    """x [S, N, D] with each block's rows reordered by index [S, N], a
    permutation of 0..N-1. The gather promises unique indices, so its
    transpose (the backward) scatters with plain stores. A plain gather's
    transpose is a scatter-add that may collide: the layer's two took 3.4
    and 3.8 ms, a sixth of a DeepSeek-V3 layer's bf16 step on the H200
    (results/h200/investigations/fp8_moe_breakdown.log)."""
    take = lambda rows, i: rows.at[i].get(unique_indices=True, mode="promise_in_bounds")  # noqa: E731
    return jax.vmap(take)(x, index)


def _inverse(permutation):
    """Each block's inverse of permutation [S, N], by a scatter: no second sort."""
    slots = jnp.broadcast_to(jnp.arange(permutation.shape[-1], dtype=permutation.dtype), permutation.shape)
    invert = lambda p, i: jnp.zeros_like(p).at[p].set(i, unique_indices=True)  # noqa: E731
    return jax.vmap(invert)(permutation, slots)


def join_gate_up(gate, up):
    """[E, D, H] gate and up kernels -> the [E, D, 2H] kernel of
    `fuse_gate_up=True` (alternating blocks of 8 columns, gate first)."""
    if gate.shape != up.shape or gate.ndim != 3 or gate.shape[-1] % GATE_BLOCK:
        raise ValueError(
            f"join_gate_up: gate and up must be [E, D, H] alike with H a multiple of {GATE_BLOCK}, "
            f"got {gate.shape} and {up.shape}"
        )
    return interleave_gate_up(gate, up)


def split_gate_up(gate_up):
    """The [E, D, 2H] fused kernel -> (gate, up), each [E, D, H]."""
    if gate_up.ndim != 3 or gate_up.shape[-1] % (2 * GATE_BLOCK):
        raise ValueError(
            f"split_gate_up: expected [E, D, 2H] with 2H a multiple of {2 * GATE_BLOCK}, got {gate_up.shape}"
        )
    return split_gate_up_blocks(gate_up)
