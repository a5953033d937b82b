"""The blockwise fp8 training recipe: the forward product and both backward
products take block-scaled fp8 operands, quantized on the fly from the
bf16/f32 values the layers keep (DeepSeek-V3's scheme).

  forward  y  = x @ W        x in (1, 128) tiles along K, W in (128, 128) blocks
  d_input  dx = dy @ W^T     dy in (1, 128) tiles along N, W's blocks as above
  d_weight dW = x^T @ dy     x^T in (1, 128) tiles along the rows (tokens),
                             dy in (128, 128) blocks

So K, N and the rows must be multiples of 128. In the grouped form the
weight gradient takes x^T and dy^T both in (1, 128) tiles along the tokens,
each group's tokens starting on a tile (the rows are regrouped with zeros
between groups: primitives/token_tiles.py), so a tile never mixes two
groups. Products accumulate in fp32 and return the activations' dtype.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jax_cluster.ops.dense import dot_general, matmul
from jax_cluster.ops.fp8_grouped import grouped_weight_gradient
from jax_cluster.ops.quantize import quantize
from jax_cluster.ops.ragged_dot import ragged_dot

RECIPES = ("blockwise",)
_WHO = "jax_cluster fp8 recipe"


def check_recipe(fp8) -> None:
    if fp8 is not None and fp8 not in RECIPES:
        raise ValueError(f"{_WHO}: fp8 must be None or one of {RECIPES}, got {fp8!r}")


def _rows_of(x, who):
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] % 128 or rows.shape[1] % 128:
        raise ValueError(
            f"{who}: the blockwise fp8 recipe needs the rows ({rows.shape[0]}) and features "
            f"({rows.shape[1]}) in multiples of 128"
        )
    return rows


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def fp8_linear(x, kernel, grad_dtype=jnp.float8_e4m3fn):
    """x [..., K] @ kernel [K, N] with the recipe's three fp8 products."""
    return _linear_forward(x, kernel, grad_dtype)[0]


def _linear_forward(x, kernel, grad_dtype):
    rows = _rows_of(x, "fp8_linear")
    y = matmul(quantize(rows), quantize(kernel, block=(128, 128)), out_dtype=x.dtype)
    return y.reshape(*x.shape[:-1], kernel.shape[1]), (x, kernel)


def _linear_backward(grad_dtype, saved, dy):
    x, kernel = saved
    rows, grads = _rows_of(x, "fp8_linear"), _rows_of(dy, "fp8_linear")
    weights = quantize(kernel, block=(128, 128))
    contract_n = (((1,), (1,)), ((), ()))  # dy [M, N] . W [K, N] over N
    dx = dot_general(quantize(grads, dtype=grad_dtype), weights, contract_n, preferred_element_type=x.dtype)
    dw = matmul(quantize(rows.T), quantize(grads, block=(128, 128), dtype=grad_dtype), out_dtype=jnp.float32)
    return dx.reshape(x.shape), dw.astype(kernel.dtype)


fp8_linear.defvjp(_linear_forward, _linear_backward)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def fp8_grouped(x, kernel, group_sizes, grad_dtype=jnp.float8_e4m3fn):
    """ragged_dot(x [M, K], kernel [G, K, N], group_sizes) with the recipe's
    three fp8 products."""
    return _grouped_forward(x, kernel, group_sizes, grad_dtype)[0]


def _grouped_forward(x, kernel, group_sizes, grad_dtype):
    _rows_of(x, "fp8_grouped")
    y = ragged_dot(quantize(x), quantize(kernel, block=(128, 128)), group_sizes, preferred_element_type=x.dtype)
    return y, (x, kernel, group_sizes)


def _grouped_backward(grad_dtype, saved, dy):
    x, kernel, group_sizes = saved
    _rows_of(dy, "fp8_grouped")
    weights = quantize(kernel, block=(128, 128))
    # [G, K, N] read as [G, N', K'] = each group's W^T: dx = dy @ W_g^T
    dx = ragged_dot(
        quantize(dy, dtype=grad_dtype), weights, group_sizes, preferred_element_type=x.dtype, rhs_layout="gnk"
    )
    # d_weight contracts the tokens: x and dy in token tiles, each group on its own tiles
    sizes = group_sizes.astype(jnp.int32)
    dw = grouped_weight_gradient(x, dy, sizes, grad_dtype, x.dtype)
    return dx, dw.astype(kernel.dtype), None


fp8_grouped.defvjp(_grouped_forward, _grouped_backward)
