"""Public gated grouped product: `gated_ragged_dot`, act(x @ gate) * (x @ up)
per group in one grouped GEMM whose epilogue gates (SwiGLU with "silu",
GEGLU with "gelu")."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_cluster.ops.ragged_dot import int32_group_sizes, ragged_dot
from jax_cluster.ops.tangents import bilinear_tangent
from jax_cluster.planning.plan import Plan
from jax_cluster.planning.tables import GATE_BLOCK
from jax_cluster.primitives import plans
from jax_cluster.primitives.gated import check_activation, gated, gated_call
from jax_cluster.primitives.lowering import gate_product
from jax_cluster.primitives.operands import SUPPORTED_DTYPES, deinterleave, interleave

_B_MAJOR = {"gkn": "n", "gnk": "k"}
_WHO = "jax_cluster.gated_ragged_dot"

__all__ = ["gated_ragged_dot", "interleave_gate_up", "split_gate_up_blocks"]


def interleave_gate_up(gate, up):
    """gate and up [..., H] (H a multiple of 8) -> [..., 2H] in alternating
    blocks of 8 columns, gate first: the rhs layout `gated_ragged_dot` reads."""
    return interleave(jnp.asarray(gate), jnp.asarray(up))


def split_gate_up_blocks(gate_up):
    """The inverse of `interleave_gate_up`: [..., 2H] -> (gate, up)."""
    return deinterleave(jnp.asarray(gate_up))


def gated_ragged_dot(
    lhs,
    rhs,
    group_sizes,
    *,
    activation: str = "silu",
    preferred_element_type=None,
    rhs_layout: str = "gkn",
    plan: Plan | None = None,
):
    """act(lhs_g @ gate_g) * (lhs_g @ up_g) for the rows of each group g.

    rhs is [G, K, 2H] (`rhs_layout="gkn"`) or [G, 2H, K] ("gnk") with gate
    and up columns in alternating blocks of 8, gate first
    (`interleave_gate_up(gate, up)` lays two [G, K, H] kernels out so);
    the output is [M, H] in `preferred_element_type` (default: the input
    dtype). `activation` is "silu" (SwiGLU), "gelu" (GEGLU, tanh form),
    "gelu_exact", "relu" or "none" (bilinear). `group_sizes` is integer
    [G] or [S, G] under `jax_cluster.ragged_dot`'s rule.

    On sm90a with bf16 or fp16 inputs in the "gkn" layout, one grouped GEMM
    computes it: its epilogue multiplies each gate value by its up value in
    the fp32 accumulators and writes only the [M, H] product, so the [M, 2H]
    pre-activation never reaches memory. Where no gated kernel takes the
    call, the plain grouped product (`ragged_dot`, with its own plan) is
    gated on XLA.

    Differentiable in lhs and rhs, in forward and reverse mode (a custom
    JVP). The derivative needs gate and up, so a differentiated call's
    forward runs the plain grouped product [M, 2H] (kept for the backward)
    and gates it on XLA; the backward is that product's, through act's
    derivative. `plan` pins the forward:
    plan_ragged(M, 2H, K, G, problem="ragged_m", epilogue="gated", ...).
    """
    check_activation(activation)
    if rhs_layout not in _B_MAJOR:
        raise ValueError(f"{_WHO}: rhs_layout must be 'gkn' or 'gnk', got {rhs_layout!r}")
    lhs, rhs, group_sizes = jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(group_sizes)
    if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise TypeError(f"{_WHO}: group_sizes must have an integer dtype, got {group_sizes.dtype}")
    if rhs.ndim != 3 or rhs.shape[2 if rhs_layout == "gkn" else 1] % (2 * GATE_BLOCK):
        raise ValueError(
            f"{_WHO}: rhs must be [G, K, 2H] or [G, 2H, K] with 2H a multiple of {2 * GATE_BLOCK} "
            f"(gate and up blocks of {GATE_BLOCK}), got {rhs.shape} ({rhs_layout})"
        )
    dtype = jnp.result_type(lhs, rhs)
    lhs, rhs = lhs.astype(dtype), rhs.astype(dtype)
    out = np.dtype(preferred_element_type if preferred_element_type is not None else dtype)
    if jnp.dtype(dtype) not in SUPPORTED_DTYPES or out not in SUPPORTED_DTYPES:  # XLA computes it all
        z = ragged_dot(lhs, rhs, group_sizes, preferred_element_type=jnp.float32, rhs_layout=rhs_layout)
        return gate_product(z, activation, out)
    sizes, b_major = int32_group_sizes(group_sizes, lhs.shape[0]), _B_MAJOR[rhs_layout]
    call = gated_call(lhs.shape, rhs.shape, sizes.shape, b_major, dtype, out)
    chosen = plans.choose(call, plan, None, _WHO)
    if not chosen.uses_kernel and plan is None:  # no gated kernel: the plain product's own plan, then the gate
        z = ragged_dot(lhs, rhs, sizes, preferred_element_type=out, rhs_layout=rhs_layout)
        return gate_product(z, activation, out)
    return _gated(lhs, rhs, sizes, activation, b_major, out, chosen)


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4, 5, 6))
def _gated(lhs, rhs, sizes, activation, b_major, out, plan):
    return gated(lhs, rhs, sizes, b_major=b_major, activation=activation, out_dtype=out, plan=plan)


def _gated_jvp(activation, b_major, out, plan, primals, tangents):
    """h = gate(z), z = lhs . rhs[g], and dh = gate'(z) . (dlhs . rhs[g] + lhs . drhs[g]).
    The derivative needs gate and up, so the primal runs the plain grouped
    product [M, 2H] and gates it on XLA; transposed (jax.grad) the tangent's
    grouped products are the input- and weight-gradient products."""
    lhs, rhs, sizes = primals
    dlhs, drhs, _ = tangents
    product = functools.partial(ragged_dot, group_sizes=sizes, rhs_layout="gkn" if b_major == "n" else "gnk")
    z = product(lhs, rhs)
    dz = bilinear_tangent(product, lhs, rhs, dlhs, drhs, like=z)
    return jax.jvp(lambda z: gate_product(z, activation, out), (z,), (dz,))


_gated.defjvp(_gated_jvp, symbolic_zeros=True)
