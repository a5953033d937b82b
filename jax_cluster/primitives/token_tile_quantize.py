"""The fp8 weight gradient's operands in block-aligned token tiles, as one
primitive: x [M, C] (rows sorted by group) -> values [C, rows] in fp8 and
scales [rows/128, C] in float32, rows in the layout of
primitives/token_tiles.py (each group starting on a 128-row tile, zeros
between groups). One scale per 128 rows of a column: amax times the float32
reciprocal of the format's largest value (1 for an all-zero tile); values
are x times 1 / scale clipped to the format, rounded to nearest even
(primitives/fp8_scaling.py).

On CUDA with `use_kernel` it is one kernel (kernels/token_tile_quantize.cu:
one read of x, one byte written per value); elsewhere, and where the kernel
does not take the call (C not a multiple of 64, another input dtype), XLA
computes the same numbers as a gather, a tile reduction and a scaling pass
ending in the fp8 transpose.

[S, G] sizes make x's rows S equal blocks, each laid out on its own `rows`
(the data-parallel form of ragged_dot): values [C, S * rows] and scales
[S * rows / 128, C], block after block. Over a mesh the blocks and the
columns split; so do the rows of one group laid out with no padding
(G = 1 and rows = M, the dense weight gradient), along whole 128-row tiles,
each shard taking its part of the group's size.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.interpreters import mlir
from jax.sharding import NamedSharding

from jax_cluster import _ffi
from jax_cluster.planning.tables import FFI_TARGETS, SCALE_BLOCK
from jax_cluster.primitives import fp8_scaling, token_tiles
from jax_cluster.primitives.lowering import clamp_group_sizes
from jax_cluster.primitives.registry import local_primitive, partitioned_primitive
from jax_cluster.primitives.specs import choose_axes, dim_axes, rule_options, spec_of, term, tied

# Whether calls take the kernel unless told, where the device runs its machine
# code (kernel_by_default): it is bitwise equal to XLA's form (GPU tests),
# clean under compute-sanitizer, and the recipe's weight gradient ran 1.5-2.6x
# faster with it than with XLA's form on five MoE shapes on the H200
# (bench_fp8_wgrad.py, 2026-12-04).
KERNEL_BY_DEFAULT = True
KERNEL_COLUMNS = 64  # the kernel's column block (kTokenTileColumns)


def _abstract_eval(x, sizes, *, rows, dtype, use_kernel):
    return (
        jax.core.ShapedArray((x.shape[1], rows), dtype),
        jax.core.ShapedArray((rows // SCALE_BLOCK, x.shape[1]), jnp.float32),
    )


def xla_token_tiles(x, sizes, *, rows, dtype, use_kernel=False):
    """The portable form; `sizes` follow ragged_dot's rule and are cut at M here."""
    sizes = clamp_group_sizes(sizes, x.shape[0])
    laid = token_tiles.laid_out(x.astype(jnp.float32), sizes, rows)
    tiles = laid.reshape(rows // SCALE_BLOCK, SCALE_BLOCK, x.shape[1])
    scales = fp8_scaling.block_scales(jnp.max(jnp.abs(tiles), axis=1), dtype)
    values = fp8_scaling.scaled_values(tiles, (1.0 / scales)[:, None, :], dtype)
    return values.reshape(rows, x.shape[1]).T, scales


def kernel_takes(x, dtype) -> bool:
    """Whether the kernel takes x [M, C] into `dtype` values."""
    return x.ndim == 2 and x.shape[1] % KERNEL_COLUMNS == 0 and fp8_scaling.kernel_formats(x.dtype, dtype)


def kernel_by_default(device=None) -> bool:
    """KERNEL_BY_DEFAULT on a device (default: the first) that runs the
    kernel's machine code (fp8_scaling.device_runs_kernels); elsewhere XLA's form."""
    return KERNEL_BY_DEFAULT and fp8_scaling.device_runs_kernels(device)


def _cuda_lowering(ctx, x, sizes, *, rows, dtype, use_kernel):
    x_aval = ctx.avals_in[0]
    if not (use_kernel and kernel_takes(x_aval, dtype) and _ffi.register_targets()):
        fallback = functools.partial(xla_token_tiles, rows=rows, dtype=dtype)
        return mlir.lower_fun(fallback, multiple_results=True)(ctx, x, sizes)
    return jax.ffi.ffi_lowering(FFI_TARGETS["quantize_token_tiles"])(ctx, x, sizes)


quantize_token_tiles_local_p = local_primitive(
    "jax_cluster_quantize_token_tiles_local",
    abstract_eval=_abstract_eval,
    xla_impl=xla_token_tiles,
    cuda_lowering=_cuda_lowering,
    multiple_results=True,
)


# --------------------------------------------------------------------------- row blocks and partitioning


def _outer_abstract_eval(x, sizes, *, rows, dtype, use_kernel):
    blocks = sizes.shape[0] if sizes.ndim == 2 else 1
    return (
        jax.core.ShapedArray((x.shape[1], blocks * rows), dtype),
        jax.core.ShapedArray((blocks * rows // SCALE_BLOCK, x.shape[1]), jnp.float32),
    )


def _by_block(x, sizes, rows, dtype, use_kernel):
    """One quantization per row block, laid out block after block."""
    params = dict(rows=rows, dtype=dtype, use_kernel=use_kernel)
    if sizes.ndim == 1:
        return tuple(quantize_token_tiles_local_p.bind(x, sizes, **params))
    blocks = sizes.shape[0]
    per_block = x.shape[0] // blocks
    parts = [
        quantize_token_tiles_local_p.bind(x[s * per_block : (s + 1) * per_block], sizes[s], **params)
        for s in range(blocks)
    ]
    if blocks == 1:
        return tuple(parts[0])
    return lax.concatenate([v for v, _ in parts], 1), lax.concatenate([t for _, t in parts], 0)


def _unpadded_group(x_shape, sizes_shape, rows) -> bool:
    """One group laid out on exactly x's rows: the layout is x's own rows
    (zeros past the size), so its 128-row tiles can split."""
    return len(sizes_shape) == 1 and sizes_shape[0] == 1 and rows == x_shape[0] and rows % SCALE_BLOCK == 0


def _sharding_rule(rows, dtype, use_kernel, mesh, operand_types, result_types):
    x, sizes = (tuple(t.shape) for t in operand_types)
    if _unpadded_group(x, sizes, rows):  # the layout's rows are x's, its tiles the scales' rows
        rows_m, tiles, size_of, keep = tied("m", rows, SCALE_BLOCK)
        rule = f"{rows_m} c, g -> c {rows_m}, {tiles} c"
        return rule, rule_options(rule, replication=keep, sizes=size_of)
    blocks = sizes[0] if len(sizes) == 2 else 1  # each block's rows whole, laid out on its own `rows`
    x_rows, s_x = term(("s", blocks), ("r", x[0] // blocks))
    laid, s_laid = term(("s", blocks), ("q", rows))
    tiles, s_tiles = term(("s", blocks), ("t", rows // SCALE_BLOCK))
    rule = f"{x_rows} c, {'s g' if len(sizes) == 2 else 'g'} -> c {laid}, {tiles} c"
    return rule, rule_options(rule, replication=("r", "q", "t"), sizes={**s_x, **s_laid, **s_tiles})


def _partition(rows, dtype, use_kernel, mesh, arg_shapes, result_shape):
    x, sizes = arg_shapes
    (on_rows, on_c), blocked = dim_axes(x), len(sizes.shape) == 2
    tiled = _unpadded_group(x.shape, sizes.shape, rows)
    candidates = [("c", on_c)]
    extents = {"c": x.shape[1], "s": 1}
    if blocked:
        candidates.append(("s", dim_axes(sizes)[0] or on_rows))
        extents["s"] = sizes.shape[0]
    elif tiled:  # the layout's tiles are x's: split them like blocks
        candidates.append(("s", on_rows))
        extents["s"] = rows // SCALE_BLOCK
    chosen = choose_axes(mesh, candidates, extents)
    split_tiles = tiled and chosen["s"]

    def per_shard(x, sizes):
        if not split_tiles:
            return _by_block(x, sizes, rows, dtype, use_kernel)
        local = x.shape[0]  # this shard's part of the one group: its rows after the earlier shards'
        first = lax.axis_index(split_tiles) * local
        part = jnp.clip(clamp_group_sizes(sizes, rows) - first, 0, local).astype(sizes.dtype)
        return _by_block(x, part, local, dtype, use_kernel)

    x_spec, sizes_spec = spec_of(("s", "c"), chosen), spec_of(("s", "g") if blocked else ("g",), chosen)
    out = (NamedSharding(mesh, spec_of(("c", "s"), chosen)), NamedSharding(mesh, spec_of(("s", "c"), chosen)))
    return mesh, per_shard, out, (NamedSharding(mesh, x_spec), NamedSharding(mesh, sizes_spec))


quantize_token_tiles_p = partitioned_primitive(
    "jax_cluster_quantize_token_tiles",
    static=("rows", "dtype", "use_kernel"),
    abstract_eval=_outer_abstract_eval,
    whole=_by_block,
    partition=_partition,
    sharding_rule=_sharding_rule,
    batch_rule="loop",
    multiple_results=True,
)


def quantize_token_tiles(x, sizes, rows: int, dtype, *, use_kernel: bool | None = None):
    """(values [C, rows], scales [rows/128, C]) of x [M, C] in token tiles;
    `sizes` int32 [G] under ragged_dot's rule, `rows` a multiple of 128 that
    holds every group on its own tiles (token_tiles.padded_rows(M, G) does).
    With sizes [S, G], each of x's S row blocks on its own `rows`
    (padded_rows(M / S, G)): values [C, S * rows], scales [S * rows / 128, C].
    `use_kernel`: None takes kernel_by_default()."""
    if x.ndim != 2 or sizes.ndim not in (1, 2) or sizes.dtype != jnp.int32:
        raise ValueError(
            f"quantize_token_tiles: x must be [M, C] and sizes int32 [G] or [S, G], got {x.shape} and {sizes}"
        )
    if sizes.shape[-1] == 0:
        raise ValueError("quantize_token_tiles: needs at least one group")
    if sizes.ndim == 2 and (sizes.shape[0] == 0 or x.shape[0] % sizes.shape[0]):
        raise ValueError(f"quantize_token_tiles: {sizes.shape[0]} row blocks do not split x's {x.shape[0]} rows")
    if rows % SCALE_BLOCK:
        raise ValueError(f"quantize_token_tiles: rows = {rows} is not a multiple of {SCALE_BLOCK}")
    use = kernel_by_default() if use_kernel is None else bool(use_kernel)
    return quantize_token_tiles_p.bind(x, sizes, rows=int(rows), dtype=np.dtype(dtype), use_kernel=use)
