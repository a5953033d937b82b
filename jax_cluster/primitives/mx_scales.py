"""MXFP8 scales in the layout CUTLASS's sm100 block-scaled GEMM reads.

An [R, K] operand (R = M for A, N for B, both K-major) has one e8m0 scale per
32 values along K: scales [R, K/32]. The kernel reads them padded and tiled
(CUTLASS's Sm1xxBlockScaledConfig): R padded to a multiple of 128, K/32 to a
multiple of 4, then one 512-byte atom per 128 rows x 4 scale columns, the
atoms K-major (all of a row tile's atoms before the next row tile's). Inside
an atom, scale (r, j) of rows r = 32 * q + p sits at byte 16 * p + 4 * q + j.
So the scale of row r and K block kb is at

    ((r // 128) * KBp / 4 + kb // 4) * 512 + (r % 32) * 16 + ((r // 32) % 4) * 4 + kb % 4

with KBp the padded K/32. Reordering is a reshape and a transpose:
[R/128, 4, 32, KBp/4, 4] (row tile, q, p, K tile, j) to (row tile, K tile,
p, q, j), which swaps axes 1 and 3 and so is its own inverse.

The grouped kernel (ragged_m) reads each group's A scales as their own
layout, from a pointer per group, so every group's scales start on a row
tile: grouped A scales are the rows of each group in the block-aligned row
layout of primitives/token_tiles.py (group g's rows from the sum of the
earlier sizes, each rounded up to 128; its tile is the atom's 128 rows),
laid out as above. Rows between groups hold 1.0 and are never read.
"""

from __future__ import annotations

import jax.numpy as jnp

from jax_cluster.planning.tables import MX_DTYPE, MX_SCALE_BLOCK, SCALE_BLOCK, SCALE_NUMPY_DTYPES
from jax_cluster.primitives import token_tiles

SCALE_DTYPE = jnp.dtype(SCALE_NUMPY_DTYPES[MX_DTYPE])  # e8m0
ROWS_PER_ATOM, BLOCKS_PER_ATOM = 128, 4
# e8m0 holds 2^(byte - 127): 127 is 1.0, the padding's value (never read as data)
ONE = 127
assert ROWS_PER_ATOM == SCALE_BLOCK, "grouped scales take token_tiles' row layout"


def is_mx_scale(scale) -> bool:
    """Whether block scales are MX's (e8m0) rather than float32 blocks of 128."""
    return jnp.dtype(scale.dtype) == SCALE_DTYPE


def padded_shape(rows: int, k: int) -> tuple[int, int]:
    """(rows, K blocks) of an [rows, K] operand's scales, padded as the kernel reads them."""
    blocks = -(-k // MX_SCALE_BLOCK)
    return -(-rows // ROWS_PER_ATOM) * ROWS_PER_ATOM, -(-blocks // BLOCKS_PER_ATOM) * BLOCKS_PER_ATOM


def layout_size(rows: int, k: int) -> int:
    """Bytes of an [rows, K] operand's scales in the kernel's layout."""
    padded_rows, padded_blocks = padded_shape(rows, k)
    return padded_rows * padded_blocks


def _atoms(x, padded_rows: int, padded_blocks: int):
    return x.reshape(padded_rows // ROWS_PER_ATOM, 4, 32, padded_blocks // BLOCKS_PER_ATOM, BLOCKS_PER_ATOM)


def to_kernel_layout(scales, k: int):
    """e8m0 scales [rows, K/32] -> the kernel's flat [layout_size(rows, K)] bytes."""
    rows, blocks = scales.shape
    if blocks != -(-k // MX_SCALE_BLOCK):
        raise ValueError(f"scales of shape {scales.shape} do not cover K = {k} in blocks of {MX_SCALE_BLOCK}")
    padded_rows, padded_blocks = padded_shape(rows, k)
    bits = jnp.asarray(scales).view(jnp.uint8)
    bits = jnp.pad(bits, ((0, padded_rows - rows), (0, padded_blocks - blocks)), constant_values=ONE)
    tiled = _atoms(bits, padded_rows, padded_blocks).transpose(0, 3, 2, 1, 4)
    return tiled.reshape(-1).view(SCALE_DTYPE)


def from_kernel_layout(flat, rows: int, k: int):
    """The inverse of to_kernel_layout: [rows, K/32] e8m0 scales."""
    padded_rows, padded_blocks = padded_shape(rows, k)
    if flat.shape != (padded_rows * padded_blocks,):
        raise ValueError(f"MX scales for [{rows}, {k}] must be [{padded_rows * padded_blocks}], got {list(flat.shape)}")
    tiled = flat.reshape(padded_rows // ROWS_PER_ATOM, padded_blocks // BLOCKS_PER_ATOM, 32, 4, BLOCKS_PER_ATOM)
    return tiled.transpose(0, 3, 2, 1, 4).reshape(padded_rows, padded_blocks)[:rows, : -(-k // MX_SCALE_BLOCK)]


def dequantized(values, flat_scales):
    """fp8 values [rows, K] times their scales (kernel layout), in float32."""
    rows, k = values.shape
    scales = from_kernel_layout(flat_scales, rows, k).astype(jnp.float32)
    return values.astype(jnp.float32) * jnp.repeat(scales, MX_SCALE_BLOCK, axis=1)[:, :k]


def grouped_layout_size(rows: int, groups: int, k: int) -> int:
    """Bytes of a grouped A's scales [rows, K/32] in the grouped kernel's layout."""
    return layout_size(token_tiles.padded_rows(rows, groups), k)


def _group_rows(sizes, rows: int):
    """(row in the block-aligned layout, inside a group) of each of `rows`
    contiguous rows; `sizes` already cut at `rows`."""
    index = jnp.arange(rows, dtype=jnp.int32)
    if sizes.shape[0] == 0:  # no groups: no row is inside one
        return index, jnp.zeros((rows,), bool)
    padded = token_tiles.padded_rows(rows, sizes.shape[0])
    ends = jnp.cumsum(sizes)
    group = jnp.clip(jnp.searchsorted(ends, index, side="right"), 0, sizes.shape[0] - 1)
    starts, _ = token_tiles.group_starts(sizes, padded)
    return starts[group] + index - (ends - sizes)[group], index < ends[-1]


def grouped_to_kernel_layout(scales, sizes, k: int):
    """e8m0 scales [rows, K/32] of rows sorted by group (`sizes` already cut
    at rows) -> the grouped kernel's flat [grouped_layout_size(rows, G, K)]."""
    rows = scales.shape[0]
    padded = token_tiles.padded_rows(rows, sizes.shape[0])
    position, inside = _group_rows(sizes, rows)
    bits = jnp.asarray(scales).view(jnp.uint8)
    laid = jnp.full((padded, bits.shape[1]), ONE, jnp.uint8)
    # rows past every group go to an index past the end, which the scatter drops
    laid = laid.at[jnp.where(inside, position, padded)].set(bits, mode="drop")
    return to_kernel_layout(laid.view(SCALE_DTYPE), k)


def grouped_from_kernel_layout(flat, sizes, rows: int, k: int):
    """The inverse of grouped_to_kernel_layout: [rows, K/32] e8m0 scales
    (1.0 for rows past every group)."""
    padded = token_tiles.padded_rows(rows, sizes.shape[0])
    laid = from_kernel_layout(flat, padded, k).view(jnp.uint8)
    position, inside = _group_rows(sizes, rows)
    taken = jnp.take(laid, jnp.where(inside, position, 0), axis=0)
    return jnp.where(inside[:, None], taken, ONE).astype(jnp.uint8).view(SCALE_DTYPE)


def grouped_dequantized(values, flat_scales, sizes):
    """fp8 values [rows, K] of a grouped A times their scales (the grouped
    kernel's layout), in float32."""
    rows, k = values.shape
    scales = grouped_from_kernel_layout(flat_scales, sizes, rows, k).astype(jnp.float32)
    return values.astype(jnp.float32) * jnp.repeat(scales, MX_SCALE_BLOCK, axis=1)[:, :k]
