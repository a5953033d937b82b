"""The block-aligned row layout of the block-scaled weight gradient (ragged_k).

The weight gradient contracts the tokens, and its fp8 operands are scaled in
tiles of SCALE_BLOCK tokens. A tile must not straddle two groups (it has one
scale), so each group's rows start on a tile: group g occupies rows
[start_g, start_g + size_g) of the padded layout, where start_g is the sum of
the earlier sizes, each rounded up to SCALE_BLOCK. Sizes follow ragged_dot's
rule (a negative size counts as 0) and groups are cut at the padded row
count, as the kernel cuts them; rows between a group's end and the next
group's start are never read.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from jax_cluster.planning.tables import SCALE_BLOCK


def padded_rows(rows: int, groups: int) -> int:
    """Rows of a layout that holds `rows` grouped rows in `groups` groups, each
    starting on a tile: at most SCALE_BLOCK - 1 rows of padding per non-empty group."""
    tiles = -(-rows // SCALE_BLOCK)
    return (tiles + min(groups, rows)) * SCALE_BLOCK


def _saturating_cumsum(x, limit):
    """Inclusive running sum that stops growing at `limit` (no int32 overflow)."""
    return lax.associative_scan(lambda u, v: jnp.minimum(u + v, limit), x)


def group_starts(group_sizes, rows: int):
    """(start, size) of each group in a padded layout of `rows` rows, cut at `rows`."""
    sizes = jnp.maximum(group_sizes, 0)
    spans = jnp.minimum(-(-sizes // SCALE_BLOCK), rows // SCALE_BLOCK + 1) * SCALE_BLOCK
    ends = _saturating_cumsum(spans, rows)
    starts = jnp.concatenate([jnp.zeros((1,), ends.dtype), ends[:-1]])
    return starts, jnp.minimum(starts + jnp.minimum(sizes, rows), rows) - starts


def row_owners(group_sizes, rows: int):
    """(group, valid) of each of the `rows` padded rows: the group whose span
    holds the row, and whether the row is inside the group's size."""
    starts, sizes = group_starts(group_sizes, rows)
    index = jnp.arange(rows, dtype=starts.dtype)
    owner = jnp.clip(jnp.searchsorted(starts, index, side="right") - 1, 0, group_sizes.shape[0] - 1)
    return owner, index - starts[owner] < sizes[owner]


def group_spans(group_sizes, rows: int):
    """Rows from each group's start to the next one's (the last to `rows`):
    contiguous groups that cover the layout, for a ragged product whose rows
    outside every group are zeros."""
    starts, _ = group_starts(group_sizes, rows)
    return jnp.concatenate([starts[1:], jnp.full((1,), rows, starts.dtype)]) - starts


def laid_out(x, sizes, rows: int):
    """x [M, C] (rows sorted by group; `sizes` already cut at M) in the
    padded layout: [rows, C], group g's rows from start_g on, zeros elsewhere."""
    sources = jnp.cumsum(sizes) - sizes  # each group's first row in x
    starts, _ = group_starts(sizes, rows)
    owner, valid = row_owners(sizes, rows)
    source = sources[owner] + jnp.arange(rows, dtype=starts.dtype) - starts[owner]
    taken = jnp.take(x, jnp.where(valid, source, 0), axis=0)
    return jnp.where(valid[:, None], taken, jnp.zeros((), x.dtype))
