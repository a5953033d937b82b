"""The fused epilogue's activations as jnp code: the fallback's, the
reference's, and what autodiff differentiates. The kernel's codes for the
same names come from the contract table (planning/contract.json)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jax_cluster.planning.tables import ACTIVATIONS

_XLA_ACTIVATIONS = {
    "none": lambda x: x,
    "relu": jax.nn.relu,
    "gelu": functools.partial(jax.nn.gelu, approximate=True),
    "gelu_exact": functools.partial(jax.nn.gelu, approximate=False),
    "silu": jax.nn.silu,
}
if set(_XLA_ACTIVATIONS) != set(ACTIVATIONS):  # a code added to the table needs its jnp twin here
    raise ImportError(f"activations: the table has {sorted(ACTIVATIONS)}, jnp twins {sorted(_XLA_ACTIVATIONS)}")


def activation_fn(name: str):
    """The activation as jnp code; a clear error for an unknown name."""
    if name not in _XLA_ACTIVATIONS:
        raise ValueError(f"jax_cluster: unknown activation {name!r}; choose from {sorted(_XLA_ACTIVATIONS)}")
    return _XLA_ACTIVATIONS[name]


def epilogue_in_dtype(z, bias, residual, *, alpha, beta, activation):
    """act(alpha * z + beta * residual + bias) in z's dtype, added as Flax's
    nnx.Linear adds its bias, so XLA fuses it as it fuses Flax's layer (into
    cuBLAS's epilogue or the next elementwise pass); bias or residual None
    when absent."""
    if alpha != 1.0:
        z = (alpha * z).astype(z.dtype)
    if residual is not None:
        z = z + (residual if beta == 1.0 else (beta * residual).astype(z.dtype))
    if bias is not None:
        z = z + bias
    return activation_fn(activation)(z)


def apply_epilogue(z, bias, c, *, alpha, beta, activation, out_dtype):
    """act(alpha * z + beta * C + bias) in float32 from a float32 product z;
    an empty bias or C is absent."""
    z = alpha * z
    if c.size:
        z = z + beta * c.astype(jnp.float32)
    if bias.size:
        z = z + bias.astype(jnp.float32)
    return activation_fn(activation)(z).astype(out_dtype)
