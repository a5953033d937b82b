"""The fp8 training recipes: the forward product and both backward products
take block-scaled fp8 operands, quantized on the fly from the bf16/f32
values the layers keep.

"blockwise" (DeepSeek-V3's scheme; block-scaled kernels on sm90a):
  forward  y  = x @ W        x in (1, 128) tiles along K, W in (128, 128) blocks
  d_input  dx = dy @ W^T     dy in (1, 128) tiles along N, W's blocks as above
  d_weight dW = x^T @ dy     x^T in (1, 128) tiles along the rows (tokens),
                             dy in (128, 128) blocks (each by its one-pass
                             quantization primitive, in the layout the
                             kernel reads in place)
"mxfp8" (OCP microscaling, e4m3 with one e8m0 scale per 32 values along
each product's contraction; MXFP8 kernels on sm100f): x and dy in (1, 32)
tiles along K and N, W in (32, 1) blocks along K for the forward and (1, 32)
along N for d_input, x^T and dy in 32-row blocks along the tokens for d_weight.
MX blocks run along the contraction only, so W and dy are quantized once per
product that reads them.

The blockwise recipe quantizes each weight once into both layouts its two
products read (ops/quantize.quantize_weight: W^T [N, K] for the forward, W
as stored for d_input, sharing the blocks' scales); the forward keeps the
second for the backward. Either way K, N and the rows must be multiples of
128 (the kernels' K tile). `fp8_weights` does that quantization ahead, once
for every call that reads the same kernel: micro-batches of a step
accumulated in a loop then pass over the weights once per step, not once per
micro-batch.
In the grouped form the blockwise weight gradient takes x^T and dy^T both in
(1, 128) tiles along the tokens, each group's tokens starting on a tile (the
rows are regrouped with zeros between groups: primitives/token_tiles.py), so
a tile never mixes two groups. The MXFP8 weight gradient takes the same
layout, x^T and dy^T in 32-row blocks, on the sm100f MX ragged_k kernel;
where no plan takes it, it runs in bf16 on x and dy rounded through MXFP8
(32-row blocks in the rows' own order, which may span two groups: a shared
scale changes the rounding, not the sum).
Products accumulate in fp32 and return the activations' dtype. On a device
without the recipe's kernels the products are dequantized to bf16: the
recipe's numerics, not its speed.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jax_cluster.ops.dense import dot_general, matmul
from jax_cluster.ops.fp8_grouped import grouped_weight_gradient, mx_weight_gradient
from jax_cluster.ops.quantize import dequantize, qarray, quantize, quantize_weight
from jax_cluster.ops.ragged_dot import group_spans, ragged_dot, zero_rows_before
from jax_cluster.primitives.ragged import ragged
from jax_cluster.primitives.token_tile_quantize import quantize_token_tiles
from jax_cluster.primitives.weight_block_quantize import quantize_weight_blocks


@dataclasses.dataclass(frozen=True)
class Recipe:
    """The blocks of each operand of the three products ((rows, columns) of
    the last two axes) and the formats the gradients may take."""

    rows: tuple[int, int]  # x and dy as the left operand: along their last axis
    weight_in: tuple[int, int]  # W [K, N] contracted over K (the forward)
    weight_out: tuple[int, int]  # W [K, N] contracted over N (d_input)
    tokens: tuple[int, int]  # x^T [K, M] as the left operand of d_weight
    grad_tokens: tuple[int, int]  # dy [M, N] contracted over M (d_weight)
    grad_dtypes: tuple = (jnp.float8_e4m3fn, jnp.float8_e5m2)


RECIPES = {
    "blockwise": Recipe((1, 128), (128, 128), (128, 128), (1, 128), (128, 128)),
    "mxfp8": Recipe((1, 32), (32, 1), (1, 32), (1, 32), (32, 1), grad_dtypes=(jnp.float8_e4m3fn,)),
}
_WHO = "jax_cluster fp8 recipe"


def check_recipe(fp8) -> None:
    if fp8 is not None and fp8 not in RECIPES:
        raise ValueError(f"{_WHO}: fp8 must be None or one of {tuple(RECIPES)}, got {fp8!r}")


def _recipe(name: str, grad_dtype) -> Recipe:
    check_recipe(name)
    recipe = RECIPES[name]
    if not any(jnp.dtype(grad_dtype) == jnp.dtype(d) for d in recipe.grad_dtypes):
        raise TypeError(f"{_WHO}: {name} takes gradients in {[jnp.dtype(d).name for d in recipe.grad_dtypes]}")
    return recipe


def _rows_of(x, who, recipe_name):
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] % 128 or rows.shape[1] % 128:
        raise ValueError(
            f"{who}: the {recipe_name} fp8 recipe needs the rows ({rows.shape[0]}) and features "
            f"({rows.shape[1]}) in multiples of 128"
        )
    return rows


@functools.partial(
    jax.tree_util.register_dataclass, data_fields=("forward", "input_grad"), meta_fields=("recipe", "shape")
)
@dataclasses.dataclass(frozen=True)
class Fp8Weights:
    """A kernel quantized ahead for a recipe's two products that read it:
    `forward` (QArray, W^T: [N, K] or [G, N, K]) and `input_grad` (QArray, W
    as stored), made by `fp8_weights`. A call given one reads these instead
    of quantizing its kernel; the kernel still takes the weight gradient, so
    training is unchanged. They stand for the kernel's values when they were
    made: make them again after each update of the kernel."""

    forward: object
    input_grad: object
    recipe: str
    shape: tuple[int, ...]


def fp8_weights(kernel, recipe: str = "blockwise", *, dtype=None) -> Fp8Weights:
    """`kernel` ([K, N], or [G, K, N] for the grouped form; cast to `dtype`
    first where given, as a layer casts it) quantized for `recipe`'s forward
    and input-gradient products, as fp8_linear and fp8_grouped would quantize
    it on every call."""
    check_recipe(recipe)
    if recipe is None:
        raise ValueError(f"{_WHO}: fp8_weights needs a recipe (a layer made with fp8=)")
    if jnp.ndim(kernel) not in (2, 3):
        raise ValueError(f"{_WHO}: fp8_weights takes a [K, N] or [G, K, N] kernel, got shape {jnp.shape(kernel)}")
    kernel = kernel if dtype is None else kernel.astype(dtype)
    forward, input_grad = _weight_operands(kernel, recipe)
    return Fp8Weights(forward, input_grad, recipe, tuple(kernel.shape))


def _weights_for(kernel, recipe: str, weights: Fp8Weights | None, who: str):
    """The forward's and the input gradient's weight operands: `weights`'
    where given (checked against the call), else quantized now."""
    if weights is None:
        return _weight_operands(kernel, recipe)
    if not isinstance(weights, Fp8Weights):
        raise TypeError(f"{who}: fp8_weights must come from fp8_weights(), got {type(weights).__name__}")
    if weights.recipe != recipe or weights.shape != tuple(kernel.shape):
        raise ValueError(
            f"{who}: fp8_weights were made for a {weights.shape} kernel in the {weights.recipe} recipe; "
            f"this call has a {tuple(kernel.shape)} kernel in the {recipe} recipe"
        )
    return weights.forward, weights.input_grad


def _weight_operands(kernel, recipe: str):
    """The weight as the forward reads it (W^T: [N, K], or [G, N, K],
    contracted over its last axis) and as the input gradient reads it (W as
    stored, contracted over N). DeepSeek-V3's 128 x 128 blocks serve both
    products, so one pass writes both layouts (ops/quantize.quantize_weight);
    MX blocks run along each product's contraction, so W is quantized once
    per product."""
    if recipe == "blockwise":
        as_stored, transposed = quantize_weight(kernel)
        return transposed, as_stored
    r = RECIPES[recipe]
    return quantize(kernel, block=r.weight_in).swapaxes(-1, -2), quantize(kernel, block=r.weight_out)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def fp8_linear(x, kernel, recipe="blockwise", grad_dtype=jnp.float8_e4m3fn, weights=None):
    """x [..., K] @ kernel [K, N] with the recipe's three fp8 products.
    `weights` (fp8_weights(kernel, recipe)) skips quantizing the kernel."""
    return _linear_forward(x, kernel, recipe, grad_dtype, weights)[0]


_CONTRACT_LAST = (((1,), (1,)), ((), ()))  # [M, C] . [D, C] over C


def _linear_forward(x, kernel, recipe, grad_dtype, weights=None):
    r = _recipe(recipe, grad_dtype)
    rows = _rows_of(x, "fp8_linear", recipe)
    w_t, w = _weights_for(kernel, recipe, weights, "fp8_linear")
    y = dot_general(quantize(rows, block=r.rows), w_t, _CONTRACT_LAST, preferred_element_type=x.dtype)
    return y.reshape(*x.shape[:-1], kernel.shape[1]), (x, kernel, w)


def _linear_backward(recipe, grad_dtype, saved, dy):
    r = RECIPES[recipe]
    x, kernel, w = saved
    rows, grads = _rows_of(x, "fp8_linear", recipe), _rows_of(dy, "fp8_linear", recipe)
    # dy [M, N] . W [K, N] over N
    dx = dot_general(quantize(grads, block=r.rows, dtype=grad_dtype), w, _CONTRACT_LAST, preferred_element_type=x.dtype)
    if recipe == "blockwise":
        dw = _blockwise_weight_gradient(rows, grads, grad_dtype)
    else:
        dy_tokens = quantize(grads, block=r.grad_tokens, dtype=grad_dtype)
        dw = matmul(quantize(rows.T, block=r.tokens), dy_tokens, out_dtype=jnp.float32)
    return dx.reshape(x.shape), dw.astype(kernel.dtype), None  # none for the weights made ahead


def _blockwise_weight_gradient(rows, grads, grad_dtype):
    """x^T [K, M] . dy [M, N] over the M tokens in float32: x^T in e4m3 1 x 128
    tiles along the tokens (the token-tile quantization with one group: the
    transpose and the scaling in one pass where its kernel runs), dy in 128 x
    128 blocks read as dy^T [N, M] (the weight-block quantization's transposed
    layout), so the block-scaled kernel reads both in place."""
    tokens = rows.shape[0]
    xt, xt_scales = quantize_token_tiles(rows, jnp.full((1,), tokens, jnp.int32), tokens, jnp.float8_e4m3fn)
    _, dyt, dy_scales = quantize_weight_blocks(grads[None], grad_dtype)
    lhs = qarray(xt, xt_scales.T)  # one scale per 128 tokens of a feature
    rhs = qarray(dyt[0], dy_scales[0].T)
    return dot_general(lhs, rhs, _CONTRACT_LAST, preferred_element_type=jnp.float32)


fp8_linear.defvjp(_linear_forward, _linear_backward)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def fp8_grouped(
    x, kernel, group_sizes, recipe="blockwise", grad_dtype=jnp.float8_e4m3fn, group_offset=None, weights=None
):
    """ragged_dot(x [M, K], kernel [G, K, N], group_sizes) with the recipe's
    three fp8 products. group_sizes is [G], or [S, G] for S row blocks.
    `group_offset` (expert parallelism, as ragged_dot's): kernel holds the
    G_local experts from it on, group_sizes all of them; rows of the other
    experts come out zero, with zero input gradients, and add nothing to
    the weight gradient. `weights` (fp8_weights(kernel, recipe)) skips
    quantizing the kernel."""
    return _grouped_forward(x, kernel, group_sizes, recipe, grad_dtype, group_offset, weights)[0]


def _grouped_forward(x, kernel, group_sizes, recipe, grad_dtype, group_offset=None, weights=None):
    r = _recipe(recipe, grad_dtype)
    _rows_of(x, "fp8_grouped", recipe)
    w_t, w = _weights_for(kernel, recipe, weights, "fp8_grouped")
    y = ragged_dot(
        quantize(x, block=r.rows),
        w_t,
        group_sizes,
        preferred_element_type=x.dtype,
        group_offset=group_offset,
        rhs_layout="gnk",
    )
    return y, (x, kernel, w, group_sizes, group_offset)


def _grouped_backward(recipe, grad_dtype, saved, dy):
    r = RECIPES[recipe]
    x, kernel, w, group_sizes, group_offset = saved
    _rows_of(dy, "fp8_grouped", recipe)
    # [G, K, N] read as [G, N', K'] = each group's W^T: dx = dy @ W_g^T (zero off the local experts)
    dx = ragged_dot(
        quantize(dy, block=r.rows, dtype=grad_dtype),
        w,
        group_sizes,
        preferred_element_type=x.dtype,
        group_offset=group_offset,
        rhs_layout="gnk",
    )
    blocks = group_sizes.shape[0] if group_sizes.ndim == 2 else 1
    rows = x.shape[0] // blocks
    # the local experts' sizes, the first taking the rows before it: zeroed in
    # dy (no gradient) and in x (kept out of its token tiles' scales)
    sizes, first_row = group_spans(group_sizes, group_offset, kernel.shape[0], rows)
    x, dy = (zero_rows_before(v, first_row, blocks, rows) for v in (x, dy))
    if recipe == "blockwise":
        # d_weight contracts the tokens: x and dy in token tiles, each group on its own tiles
        dw = grouped_weight_gradient(x, dy, sizes, grad_dtype, x.dtype)
    else:  # MXFP8 on the MX ragged_k kernel, or bf16 on the MXFP8-rounded operands
        dw = mx_weight_gradient(x, dy, sizes, x.dtype)
        if dw is None:
            xq, dyq = (dequantize(quantize(v, block=r.grad_tokens), jnp.bfloat16) for v in (x, dy))
            dw = ragged(xq, dyq, sizes, problem="ragged_k", out_dtype=x.dtype)
    return dx, dw.astype(kernel.dtype), None, None, None


fp8_grouped.defvjp(_grouped_forward, _grouped_backward)
