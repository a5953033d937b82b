"""Block-scaled fp8 operands: `quantize`, `dequantize`, and the checks the
ops make on quantized operands.

Quantized operands are qwix's `QArray` (the type tokamax and MaxText use):
`qvalue` in float8_e4m3fn or float8_e5m2, `scale` in float32 with one entry
per block. Two block shapes cover DeepSeek-V3's recipe:
  (1, 128)   activations: each row's K split into tiles of 128;
  (128, 128) weights: [K, N] (or each group's [K, N] of a [G, K, N] stack)
             in 128 x 128 blocks.
MXFP8 (the OCP microscaling format, which Blackwell's tensor cores read):
e4m3 values with one power-of-two scale (e8m0) per 32 values along the
contraction, `qtype` "mxfp8":
  (1, 32)    activations [M, K], and weights stored [N, K];
  (32, 1)    weights stored [K, N] (each group's of a [G, K, N] stack).
The block names the last two axes; leading axes (a group axis) get a scale
each. Dense products run on the block-scaled fp8 kernels where a plan takes
them (ops/fp8_dense.py), grouped ones in DeepSeek-V3's blocks on the grouped
kernel (ops/fp8_grouped.py); elsewhere the ops dequantize to bfloat16 and
take the bf16 path: the recipe's rounding with bf16's speed. QArrays of
integer values (qwix's int8 and int4) are dequantized before any of this.
"""

from __future__ import annotations

import sys

import jax.numpy as jnp

from jax_cluster.planning.tables import MX_SCALE_BLOCK, SCALE_BLOCK
from jax_cluster.primitives import mx_scales
from jax_cluster.primitives.weight_block_quantize import quantize_weight_blocks

FP8_DTYPES = (jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.float8_e5m2))
# activations' tiles and weights' blocks: the kernels' scale block (tables.SCALE_BLOCK)
ACTIVATION_BLOCK, WEIGHT_BLOCK = (1, SCALE_BLOCK), (SCALE_BLOCK, SCALE_BLOCK)
# MXFP8: 32 values along K share a scale, whichever axis K is
MX_ROW_BLOCK, MX_COLUMN_BLOCK = (1, MX_SCALE_BLOCK), (MX_SCALE_BLOCK, 1)
MX_BLOCKS = (MX_ROW_BLOCK, MX_COLUMN_BLOCK)
BLOCKS = (ACTIVATION_BLOCK, WEIGHT_BLOCK, *MX_BLOCKS)
MX_SCALE_DTYPE = mx_scales.SCALE_DTYPE
_WHO = "jax_cluster.quantize"


def _qwix():
    try:
        import qwix
    except ImportError as e:  # an optional dependency: only fp8 needs it
        raise ImportError("fp8 operands need qwix (pip install qwix)") from e
    return qwix


def is_quantized(x) -> bool:
    """Whether `x` is a qwix QArray (False without importing qwix when no
    QArray can exist yet)."""
    if "qwix" not in sys.modules:
        return False
    return isinstance(x, _qwix().QArray)


def quantize(x, *, block=ACTIVATION_BLOCK, dtype=jnp.float8_e4m3fn):
    """x [..., R, C] -> a qwix QArray with one scale per block of the last two
    axes (see the module docstring): float32 for DeepSeek-V3's blocks, e8m0
    for MXFP8's (e4m3 only); leading axes are scaled apart. R must be a
    multiple of block[0] and C of block[1]."""
    block, dtype = tuple(block), jnp.dtype(dtype)
    if block not in BLOCKS:
        raise ValueError(f"{_WHO}: block must be one of {BLOCKS}, got {block}")
    if dtype not in FP8_DTYPES:
        raise TypeError(f"{_WHO}: dtype must be float8_e4m3fn or float8_e5m2, got {dtype}")
    if block in MX_BLOCKS and dtype != jnp.float8_e4m3fn:
        raise TypeError(f"{_WHO}: MXFP8 blocks {block} hold float8_e4m3fn values, got {dtype}")
    x = jnp.asarray(x)
    if x.ndim < 2:
        raise ValueError(f"{_WHO}: x must have at least two axes (rows, columns), got shape {x.shape}")
    rows, cols = x.shape[-2:]
    if rows % block[0] or cols % block[1]:
        raise ValueError(f"{_WHO}: the last two axes {(rows, cols)} are not multiples of the block {block}")
    channels, tiled = tuple(range(x.ndim - 2)), {}
    for axis, size in zip((x.ndim - 2, x.ndim - 1), block):
        if size == 1:
            channels += (axis,)
        else:
            tiled[axis] = size
    if block in MX_BLOCKS:  # qwix's MX rounds each scale up to a power of two: no value saturates
        return _qwix().quantize(x, "mxfp8", channelwise_axes=channels, tiled_axes=tiled, scale_dtype=MX_SCALE_DTYPE)
    return _qwix().quantize(x, dtype, channelwise_axes=channels, tiled_axes=tiled, scale_dtype=jnp.float32)


def quantize_weight(w, dtype=jnp.float8_e4m3fn, *, use_kernel: bool | None = None):
    """w [K, N] (or a stack [G, K, N]) in 128 x 128 blocks, in both layouts
    the block-scaled kernels read, as two QArrays that share the blocks'
    float32 scales: w as stored (what a product contracting N reads in
    place) and w transposed to [N, K] ([G, N, K]: what a product
    contracting K reads in place). One pass over w on CUDA where the kernel
    runs (`use_kernel`: None takes the default of
    primitives/weight_block_quantize.py), else XLA's amax and scaling
    passes. K and N must be multiples of 128. The scales are amax / the
    format's largest value in float32 (primitives/fp8_scaling.py), where
    `quantize` divides in w's own dtype (qwix's rule): for bf16 weights the
    two may round a value one step apart."""
    w, dtype = jnp.asarray(w), jnp.dtype(dtype)
    if w.ndim not in (2, 3) or w.shape[-2] % SCALE_BLOCK or w.shape[-1] % SCALE_BLOCK:
        raise ValueError(
            f"jax_cluster.quantize_weight: w must be [K, N] or [G, K, N] with K and N multiples of "
            f"{SCALE_BLOCK}, got shape {w.shape}"
        )
    if dtype not in FP8_DTYPES:
        raise TypeError(f"jax_cluster.quantize_weight: dtype must be float8_e4m3fn or float8_e5m2, got {dtype}")
    stack = w if w.ndim == 3 else w[None]
    kn, nk, scales = quantize_weight_blocks(stack, dtype, use_kernel=use_kernel)
    if w.ndim == 2:
        kn, nk, scales = kn[0], nk[0], scales[0]
    return qarray(kn, scales), qarray(nk, jnp.swapaxes(scales, -1, -2))


def qarray(values, scales):
    """A QArray of fp8 `values` and their float32 block `scales` (one per
    block of the last two axes), made elsewhere (a quantization kernel)."""
    return _qwix().QArray(values, scales, None, jnp.dtype(values.dtype))


def dequantize(q, dtype=jnp.float32):
    """The values a QArray stands for, in `dtype`."""
    if not is_quantized(q):
        raise TypeError(f"jax_cluster.dequantize: expected a qwix QArray, got {type(q).__name__}")
    if q.scale.dtype != jnp.float32:  # qwix multiplies in the scale's dtype: e8m0 holds no fp8 value
        q = q.replace(scale=q.scale.astype(jnp.float32))
    return _qwix().dequantize(q).astype(dtype)


def block_of(q) -> tuple[int, int]:
    """The (rows, columns) block of a QArray's last two axes, from its shapes."""
    value, scale = q.qvalue, q.scale
    if value.ndim < 2 or scale.ndim != value.ndim:
        raise ValueError(f"scales of shape {scale.shape} do not tile values of shape {value.shape}")
    for axis in range(value.ndim - 2):
        if scale.shape[axis] != value.shape[axis]:
            raise ValueError(f"scales of shape {scale.shape} must keep the leading axes of {value.shape}")
    out = []
    for size, blocks in zip(value.shape[-2:], scale.shape[-2:]):
        if blocks == 0 or size % blocks:
            raise ValueError(f"scales of shape {scale.shape} do not tile values of shape {value.shape}")
        out.append(size // blocks)
    return tuple(out)


def check_operand(who: str, name: str, q, want_blocks, scale_dtype=jnp.float32) -> None:
    """A clear error at trace time for a quantized operand the recipe cannot take."""
    if jnp.dtype(q.qvalue.dtype) not in FP8_DTYPES:
        raise TypeError(f"{who}: {name} must hold float8_e4m3fn or float8_e5m2 values, got {q.qvalue.dtype}")
    if jnp.dtype(q.scale.dtype) != jnp.dtype(scale_dtype):
        raise TypeError(f"{who}: {name}'s scales must be {jnp.dtype(scale_dtype)}, got {q.scale.dtype}")
    if getattr(q, "zero_point", None) is not None:
        raise ValueError(f"{who}: {name} has a zero point; block-scaled fp8 is symmetric")
    block = block_of(q)
    if block not in want_blocks:
        wanted = " or ".join(f"{r}x{c}" for r, c in want_blocks)
        raise ValueError(
            f"{who}: {name} must be scaled in {wanted} blocks of its last two axes, "
            f"got {block[0]}x{block[1]} (values {q.qvalue.shape}, scales {q.scale.shape})"
        )


def is_integer_quantized(x) -> bool:
    """Whether `x` is a QArray of integer values (qwix's int8, int4, ...)."""
    return is_quantized(x) and jnp.issubdtype(x.qvalue.dtype, jnp.integer)


def dequantize_integer_operands(*operands):
    """The operands with each QArray of integer values (qwix's int8 or int4,
    any tiling or zero point: weight-only quantization, say) replaced by the
    values it stands for, in its scales' dtype. No kernel here reads integer
    values, so such a call runs as on the dequantized arrays; fp8 QArrays
    pass through to the block-scaled paths and their checks."""
    return tuple(dequantize(x, x.scale.dtype) if is_integer_quantized(x) else x for x in operands)


def quantized_operands(who: str, lhs, rhs):
    """(lhs, rhs) when both are block-scaled fp8 QArrays of one format
    (DeepSeek-V3's: lhs 1x128, rhs 128x128; MXFP8: lhs 1x32, rhs 32x1 or
    1x32), else None when neither is quantized; a mix, or other blocks, is an
    error."""
    quantized = is_quantized(lhs), is_quantized(rhs)
    if not any(quantized):
        return None
    if not all(quantized):
        raise TypeError(
            f"{who}: quantize both operands (jax_cluster.quantize: activations in (1, 128) blocks, "
            "weights in (128, 128)) or neither"
        )
    if mx_scales.is_mx_scale(lhs.scale):
        check_operand(who, "lhs", lhs, (MX_ROW_BLOCK,), MX_SCALE_DTYPE)
        check_operand(who, "rhs", rhs, MX_BLOCKS, MX_SCALE_DTYPE)
    else:
        check_operand(who, "lhs", lhs, (ACTIVATION_BLOCK,))
        check_operand(who, "rhs", rhs, (WEIGHT_BLOCK,))
    return lhs, rhs


def dequantized_operands(who: str, lhs, rhs):
    """quantized_operands' pair as bfloat16, or None when neither is quantized."""
    pair = quantized_operands(who, lhs, rhs)
    return None if pair is None else tuple(dequantize(q, jnp.bfloat16) for q in pair)
