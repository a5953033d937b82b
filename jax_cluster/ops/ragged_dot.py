"""Public grouped GEMM: `ragged_dot`, a drop-in for jax.lax.ragged_dot."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from jax_cluster.ops import output_sharding
from jax_cluster.ops.fp8_grouped import scaled_grouped_product
from jax_cluster.ops.precision import check_precision, needs_xla
from jax_cluster.ops.quantize import dequantize, dequantize_integer_operands, quantized_operands
from jax_cluster.planning.plan import Plan
from jax_cluster.primitives.activations import activation_fn
from jax_cluster.primitives.lowering import clamp_group_sizes
from jax_cluster.primitives.operands import SUPPORTED_DTYPES
from jax_cluster.primitives.ragged import ragged

_B_MAJOR = {"gkn": "n", "gnk": "k"}
_WHO = "jax_cluster.ragged_dot"


def ragged_dot(
    lhs,
    rhs,
    group_sizes,
    precision=None,
    preferred_element_type=None,
    group_offset=None,
    out_sharding=None,
    *,
    rhs_layout: str = "gkn",
    activation=None,
    plan: Plan | None = None,
):
    """Grouped GEMM: rows of `lhs` [M,K] split into G consecutive groups, and
    group g multiplied by its own matrix rhs[g]. The positional arguments are
    `jax.lax.ragged_dot`'s; the keyword-only ones are this package's.

    rhs is [G,K,N] (`rhs_layout="gkn"`, as in `jax.lax.ragged_dot`) or
    [G,N,K] (`"gnk"`, read in place: no transpose is made). `group_sizes` is
    an integer [G] array (any integer dtype) that stays on the device: nothing
    waits for its values, so the call works under jit and in CUDA graphs. The
    output is [M,N] in `preferred_element_type` (default: the input dtype);
    accumulation is fp32. Mixed input dtypes promote. `precision` matters
    only where XLA computes (float32 and wider inputs); `out_sharding` places
    the output as lax's does.

    `group_sizes` may also be [S,G]: the M rows are then S equal blocks, block
    s grouped by group_sizes[s] (each block as if it were its own call). This
    is the data-parallel form: with lhs rows and group_sizes sharded on the
    same mesh axes under jit, each device runs only its own blocks, rhs is
    replicated, and the weight gradient is summed over the shards.

    Group sizes: group g covers rows [min(s_g, M), min(s_g + max(size_g, 0), M)),
    where s_g is the sum of max(size, 0) over the groups before it. So a
    negative size counts as 0, groups are cut at M (sum > M never reads or
    writes out of bounds) and rows past the last group are zero. The kernel
    and the XLA fallback follow the same rule.

    `activation`: None, a name ("relu", "gelu", "gelu_exact", "silu") or a
    callable, applied to the product (as tokamax's `activation=`); it runs on
    XLA after the grouped GEMM, not yet in its epilogue.

    `group_offset` (an integer scalar or (1,) array, for expert
    parallelism): group_sizes holds all G groups and rhs only the G_local =
    rhs.shape[0] groups from `group_offset` on. Rows of group g in
    [offset, offset + G_local) multiply
    rhs[g - offset]; every other row of the output is zero, and so are their
    gradients.

    Block-scaled fp8 operands (`jax_cluster.quantize`: lhs [M, K] in (1, 128)
    blocks, rhs [G, K, N] or [G, N, K] in (128, 128) blocks of each group's
    matrix) give a bfloat16 result by default, [S, G] sizes and sharding
    included. They run the block-scaled grouped kernel under a plan that
    takes it (plan_ragged(M / S, N, K, G,
    problem="ragged_m", dtype=jnp.float8_e4m3fn, out_dtype=..., a_major="k",
    b_major="k"), group_offset included; otherwise they are dequantized to
    bfloat16 and run the bf16 grouped path. QArrays of integer values
    (qwix's int8 or int4, any tiling: tokamax's quantized inputs) are
    dequantized in their scales' dtype, either operand alone included.

    Differentiable in lhs and rhs: d_lhs is the same grouped product with
    rhs read transposed in place, d_rhs[g] = lhs_g^T dy_g. vmap runs a loop
    over the mapped axis. Bf16/fp16 inputs on sm90a run the grouped kernel
    when `jax_cluster.plan_ragged` picks one (products small enough that
    XLA's dense expansion measured faster stay on XLA); all else runs
    `jax.lax.ragged_dot_general`. `plan` pins the choice; it must be made for
    this call: plan_ragged(M, N, K, G, problem="ragged_m", b_major="n" for
    "gkn" or "k" for "gnk", ..., route="kernel" to skip the routing).
    """
    check_precision(_WHO, precision)
    lhs, rhs = dequantize_integer_operands(lhs, rhs)
    quantized = quantized_operands(_WHO, lhs, rhs)
    if quantized is not None:  # per group, rhs's (128, 128) blocks tile its own [K, N] (or [N, K])
        out = preferred_element_type if preferred_element_type is not None else jnp.bfloat16
        group_sizes = jnp.asarray(group_sizes)
        integral = jnp.issubdtype(group_sizes.dtype, jnp.integer)
        blocks = group_sizes.shape[0] if group_sizes.ndim == 2 else 1
        rows = quantized[0].qvalue.shape[0] // max(blocks, 1)
        if integral and group_sizes.ndim in (1, 2) and rhs_layout in _B_MAJOR and rows * blocks > 0:
            sizes, first_row = group_spans(group_sizes, group_offset, quantized[1].qvalue.shape[0], rows)
            direct = scaled_grouped_product(*quantized, sizes, rhs_layout, out, plan)
            if direct is not None:
                return _finish(zero_rows_before(direct, first_row, blocks, rows), activation, out_sharding)
        return ragged_dot(
            *(dequantize(q, jnp.bfloat16) for q in quantized),
            group_sizes,
            precision,
            out,
            group_offset,
            out_sharding,
            rhs_layout=rhs_layout,
            activation=activation,
            plan=plan,
        )
    if rhs_layout not in _B_MAJOR:
        raise ValueError(f"{_WHO}: rhs_layout must be 'gkn' ([G,K,N]) or 'gnk' ([G,N,K]), got {rhs_layout!r}")
    lhs, rhs, group_sizes = jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(group_sizes)
    if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise TypeError(f"{_WHO}: group_sizes must have an integer dtype, got {group_sizes.dtype}")
    dtype = jnp.result_type(lhs, rhs)
    lhs, rhs = lhs.astype(dtype), rhs.astype(dtype)
    if lhs.ndim != 2 or rhs.ndim != 3:
        raise ValueError(
            f"{_WHO}: lhs must be [M,K] and rhs [G,K,N] or [G,N,K], got shapes {lhs.shape} and {rhs.shape}"
        )
    blocks = group_sizes.shape[0] if group_sizes.ndim == 2 else 1
    rows = lhs.shape[0] // blocks if blocks else 0
    sizes, first_row = group_spans(group_sizes, group_offset, rhs.shape[0], rows)
    if (
        jnp.dtype(dtype) not in SUPPORTED_DTYPES
        or (preferred_element_type is not None and jnp.dtype(preferred_element_type) not in SUPPORTED_DTYPES)
        or needs_xla(precision, dtype)
    ):
        out = _lax_ragged_dot(lhs, rhs, sizes, rhs_layout, precision, preferred_element_type)
    else:
        out = ragged(
            lhs,
            rhs,
            sizes,
            problem="ragged_m",
            b_major=_B_MAJOR[rhs_layout],
            out_dtype=preferred_element_type,
            plan=plan,
        )
    return _finish(zero_rows_before(out, first_row, blocks, rows), activation, out_sharding)


def zero_rows_before(out, first_row, blocks, rows):
    """Under group_offset, the rows of other shards' groups were computed
    against the first local matrix: zero them (first_row: [blocks], or None
    without group_offset). Shared with the fp8 recipe's backward."""
    if first_row is None:
        return out
    row = jnp.arange(out.shape[0]) % max(rows, 1)
    keep = (row.reshape(blocks, rows) >= first_row[:, None]).reshape(-1)
    return jnp.where(keep[:, None], out, jnp.zeros((), out.dtype))


def _finish(out, activation, out_sharding):
    """The activation after the product, then the requested output sharding."""
    if activation is not None:
        out = (activation_fn(activation) if isinstance(activation, str) else activation)(out)
    if output_sharding.constrains(out_sharding, _WHO):
        out = output_sharding.place(out, out_sharding)
    return out


def group_spans(group_sizes, group_offset, local: int, rows: int):
    """(int32 sizes of the groups the product runs, first rows to zero or
    None): all groups without group_offset, else the `local` ones from it,
    the first also taking the rows before it. `rows`: one row block's.
    Shared with the fp8 recipe's backward."""
    if group_offset is None:
        return int32_group_sizes(group_sizes, rows), None
    return _local_groups(_clipped_int32(group_sizes, rows), group_offset, local, rows)


def int32_group_sizes(group_sizes, rows):
    """Group sizes as int32 under the kernels' rule. int32 sizes pass as they
    are: the kernels and both XLA paths clamp them themselves, and a clip here
    would be one more XLA kernel per call (2 us at decode sizes)."""
    return group_sizes if group_sizes.dtype == jnp.int32 else _clipped_int32(group_sizes, rows)


def _clipped_int32(group_sizes, rows):
    """Sizes past the rows change no group's span (each is cut at the rows), so
    any integer dtype narrows to int32 without wrapping; the bound itself must
    fit the sizes' dtype (1000 as an int8 would wrap)."""
    top = min(rows, int(jnp.iinfo(group_sizes.dtype).max))
    return jnp.clip(group_sizes, 0, top).astype(jnp.int32)


def _local_groups(sizes, group_offset, local, rows):
    """([..., G_local] sizes of the local groups, [blocks] their first row).

    The first local group also takes the rows of the groups before it, so the
    grouped product starts at row 0 as it always does; those rows are zeroed
    afterwards. Rows of the groups after the local ones are past the last
    group, which the product leaves zero."""
    blocked = sizes.reshape(-1, sizes.shape[-1])
    total = blocked.shape[-1]
    offset = jnp.asarray(group_offset)
    if not jnp.issubdtype(offset.dtype, jnp.integer):
        raise TypeError(f"{_WHO}: group_offset must be an integer, got {offset.dtype}")
    if offset.shape not in ((), (1,)):  # lax.ragged_dot documents a (1,) array
        raise ValueError(f"{_WHO}: group_offset must be a scalar or of shape (1,), got shape {offset.shape}")
    offset = offset.reshape(()).astype(jnp.int32)
    if local > total:
        raise ValueError(f"{_WHO}: rhs holds {local} groups but group_sizes only {total}")
    before = jnp.where(jnp.arange(total) < offset, blocked, 0).sum(axis=-1)
    first_row = jnp.minimum(before, rows)
    # empty groups on both sides, so a window reaching past either end reads zeros
    pad = jnp.zeros((blocked.shape[0], local), blocked.dtype)
    padded = jnp.concatenate([pad, blocked, pad], axis=1)
    window = lax.dynamic_slice_in_dim(padded, jnp.clip(offset + local, 0, total + local), local, axis=1)
    window = window.at[:, 0].add(first_row)
    return window.reshape(*sizes.shape[:-1], local), first_row


def _lax_ragged_dot(lhs, rhs, sizes, rhs_layout, precision, preferred_element_type):
    """XLA's ragged_dot for what the kernels' primitive does not take (integers,
    float64, a precision asked of float32), on sizes clamped by the same rule."""
    rows = lhs.shape[0] // (sizes.shape[0] if sizes.ndim == 2 else 1)
    sizes = (
        jnp.stack([clamp_group_sizes(s, rows) for s in sizes]) if sizes.ndim == 2 else clamp_group_sizes(sizes, rows)
    )
    if rhs_layout == "gnk":
        rhs = jnp.swapaxes(rhs, 1, 2)
    if sizes.ndim == 2:  # S row blocks, each its own problem
        blocks = sizes.shape[0]
        parts = jnp.split(lhs, blocks)
        outs = [
            lax.ragged_dot(p, rhs, s, precision=precision, preferred_element_type=preferred_element_type)
            for p, s in zip(parts, sizes)
        ]
        return jnp.concatenate(outs)
    return lax.ragged_dot(lhs, rhs, sizes, precision=precision, preferred_element_type=preferred_element_type)
