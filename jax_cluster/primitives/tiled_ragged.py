"""The grouped product on the CPU as a loop over (row tile, group) pieces.

XLA expands `ragged_dot` into one dense product per group, masked: G times
the work of the grouped product itself (on a CPU, 962 GFLOP of Mixtral's
8x7B layer cost as much as 7.7 TFLOP). Here the rows are cut at every tile
boundary and every group boundary; each piece multiplies its tile by its one
group's matrix and keeps only its own rows. There are at most tiles + G
pieces, so with tiles of about M / (4G) rows the pieces hold at most 1.25x
the product's rows, plus up to 8 a group where tiles of 8 rows (the least)
are more than M / (4G).

Sizes must already be clamped (lowering.clamp_group_sizes): non-negative,
summing to at most the rows. Rows past the last group stay zero.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

_MIN_TILE = 8


def tile_rows(rows: int, groups: int) -> int:
    """Rows per tile: about rows / (4 * groups), so the pieces' masked rows
    (one tile at most per group boundary) add at most a quarter."""
    want = -(-rows // (4 * max(groups, 1)))
    return max(_MIN_TILE, -(-want // _MIN_TILE) * _MIN_TILE)


def _pieces(sizes, rows: int, tile: int):
    """[tiles + G] (first row, tile, group, end row) of every piece, in row
    order; a piece with first row >= end row is empty (a padding slot)."""
    tiles = -(-rows // tile)
    ends = jnp.cumsum(sizes)
    starts = jnp.concatenate([jnp.arange(tiles, dtype=sizes.dtype) * tile, ends - sizes])
    starts = jnp.sort(starts)
    total = ends[-1]
    repeated = jnp.concatenate([jnp.zeros((1,), bool), starts[1:] == starts[:-1]])
    group = jnp.searchsorted(ends, starts, side="right").astype(jnp.int32)
    group = jnp.minimum(group, sizes.shape[0] - 1)
    tile_of = starts // tile
    end = jnp.minimum((tile_of + 1) * tile, ends[group])
    end = jnp.where(repeated | (starts >= total), starts, end)
    return starts, tile_of.astype(jnp.int32), group, end


def tiled_ragged_m(a, b, sizes, *, b_major: str, precision=None):
    """a [M,K], b [G,K,N] ("n") or [G,N,K] ("k") -> float32 [M,N]."""
    rows = a.shape[0]
    n = b.shape[2] if b_major == "n" else b.shape[1]
    tile = tile_rows(rows, sizes.shape[0])
    tiles = -(-rows // tile)
    a = jnp.pad(a, ((0, tiles * tile - rows), (0, 0)))
    first, tile_of, group, end = _pieces(sizes, rows, tile)
    contract = 0 if b_major == "n" else 1

    def piece(i, out):
        at = tile_of[i] * tile
        x = lax.dynamic_slice_in_dim(a, at, tile)
        w = lax.dynamic_index_in_dim(b, group[i], keepdims=False)
        y = lax.dot_general(x, w, (((1,), (contract,)), ((), ())), precision, preferred_element_type=jnp.float32)
        row = at + jnp.arange(tile)
        mine = (row >= first[i]) & (row < end[i])
        acc = lax.dynamic_slice_in_dim(out, at, tile)
        return lax.dynamic_update_slice_in_dim(out, acc + jnp.where(mine[:, None], y, 0.0), at, 0)

    out = lax.fori_loop(0, first.shape[0], piece, jnp.zeros((tiles * tile, n), jnp.float32))
    return out[:rows]


def tiled_ragged_k(a, b, sizes, *, precision=None):
    """a [M,K'], b [M,N'], the rows contracted per group -> float32 [G,K',N']."""
    rows, groups = a.shape[0], sizes.shape[0]
    tile = tile_rows(rows, groups)
    tiles = -(-rows // tile)
    pad = ((0, tiles * tile - rows), (0, 0))
    a, b = jnp.pad(a, pad), jnp.pad(b, pad)
    first, tile_of, group, end = _pieces(sizes, rows, tile)

    def piece(i, out):
        at = tile_of[i] * tile
        row = at + jnp.arange(tile)
        mine = (row >= first[i]) & (row < end[i])
        x = jnp.where(mine[:, None], lax.dynamic_slice_in_dim(a, at, tile), 0)
        y = lax.dynamic_slice_in_dim(b, at, tile)
        part = lax.dot_general(x, y, (((0,), (0,)), ((), ())), precision, preferred_element_type=jnp.float32)
        return out.at[group[i]].add(part)

    init = jnp.zeros((groups, a.shape[1], b.shape[1]), jnp.float32)
    return lax.fori_loop(0, first.shape[0], piece, init)
