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
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import mlir

from jax_cluster import _ffi
from jax_cluster.planning.tables import FFI_TARGETS, SCALE_BLOCK
from jax_cluster.primitives import fp8_scaling, token_tiles
from jax_cluster.primitives.lowering import clamp_group_sizes
from jax_cluster.primitives.registry import local_primitive

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


quantize_token_tiles_p = local_primitive(
    "jax_cluster_quantize_token_tiles",
    abstract_eval=_abstract_eval,
    xla_impl=xla_token_tiles,
    cuda_lowering=_cuda_lowering,
    multiple_results=True,
    batch_rule="loop",
)


def quantize_token_tiles(x, sizes, rows: int, dtype, *, use_kernel: bool | None = None):
    """(values [C, rows], scales [rows/128, C]) of x [M, C] in token tiles;
    `sizes` int32 [G] under ragged_dot's rule, `rows` a multiple of 128 that
    holds every group on its own tiles (token_tiles.padded_rows(M, G) does).
    `use_kernel`: None takes kernel_by_default()."""
    if x.ndim != 2 or sizes.ndim != 1 or sizes.dtype != jnp.int32:
        raise ValueError(f"quantize_token_tiles: x must be [M, C] and sizes int32 [G], got {x.shape} and {sizes}")
    if sizes.shape[0] == 0:
        raise ValueError("quantize_token_tiles: needs at least one group")
    if rows % SCALE_BLOCK:
        raise ValueError(f"quantize_token_tiles: rows = {rows} is not a multiple of {SCALE_BLOCK}")
    use = kernel_by_default() if use_kernel is None else bool(use_kernel)
    return quantize_token_tiles_p.bind(x, sizes, rows=int(rows), dtype=np.dtype(dtype), use_kernel=use)
