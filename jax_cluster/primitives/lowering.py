"""The one-device primitives each shard binds, with a concrete Plan: the FFI
call of a kernel plan on CUDA, and XLA's own ops everywhere else (the
fallbacks, which follow the kernels' semantics exactly).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.interpreters import mlir

from jax_cluster import _ffi
from jax_cluster.planning import routing
from jax_cluster.planning.plan import Plan
from jax_cluster.planning.tables import ACTIVATIONS, FFI_TARGETS, SCALE_BLOCK
from jax_cluster.primitives import mx_scales, token_tiles
from jax_cluster.primitives.activations import activation_fn, apply_epilogue, epilogue_in_dtype
from jax_cluster.primitives.operands import deinterleave, gemm_dims, ragged_out_shape
from jax_cluster.primitives.registry import local_primitive
from jax_cluster.primitives.tiled_ragged import tiled_ragged_k, tiled_ragged_m


def lower_kernel_call(ctx, target, plan: Plan, *operands, **attrs):
    """The FFI call of a kernel plan, for any of the package's targets; `attrs`
    are the target's attributes besides the plan."""
    out_aval = ctx.avals_out[0]
    # Scratch comes from XLA as a second result, so the call stays graph-safe.
    ws_aval = jax.core.ShapedArray((max(plan.workspace_bytes, 16),), np.uint8)
    lowering = jax.ffi.ffi_lowering(target)
    results = lowering(ctx.replace(avals_out=[out_aval, ws_aval]), *operands, plan=plan.ffi_attrs(), **attrs)
    return results[:1]


def _runs_kernel(plan: Plan) -> bool:
    return plan.uses_kernel and _ffi.register_targets()


# --------------------------------------------------------------------------- dense


def _gemm_abstract_eval(a, b, *, a_major, b_major, out_dtype, plan):
    batch, m, n, _, _ = gemm_dims(a.shape, b.shape, a_major, b_major)
    return jax.core.ShapedArray((*batch, m, n), out_dtype)


def xla_gemm(a, b, *, a_major, b_major, out_dtype, plan, wide=True):
    """The portable path: XLA's own dot with the same layouts.

    `wide`: accumulate into an fp32 result and cast, like the kernels. Asked
    for bf16, XLA turns degenerate dots (K=1, M=N=1) into bf16
    multiply-reduces that lose ~1e-2, and CPU dots may accumulate in bf16.
    On a GPU, cuBLAS accumulates in fp32 anyway, and the fp32 result costs an
    extra pass over D (8448^2x4096 bf16: 0.82 against 0.72 ms on the H200).
    """
    nb = a.ndim - 2
    batch = tuple(range(nb))
    contract_a = nb + 1 if a_major == "k" else nb
    contract_b = nb + 1 if b_major == "k" else nb
    out = lax.dot_general(
        a,
        b,
        (((contract_a,), (contract_b,)), (batch, batch)),
        preferred_element_type=jnp.float32 if wide else out_dtype,
    )
    return out.astype(out_dtype)


def _degenerate(m, n, k) -> bool:
    """Dots XLA rewrites into bf16 multiply-reduces: K = 1, or a dot product
    (M = N = 1). A matrix-vector product (M = 1 alone) is left to XLA's own
    GEMV, as jnp.matmul gets it: an fp32 result there cost 1.04-1.23x the
    time on the H200's M=1 model layers (dense suite, 2026-12-02)."""
    return k <= 1 or (m <= 1 and n <= 1)


def xla_gemm_padded_k(a, b, *, a_major, b_major, out_dtype, plan):
    """XLA's dot of a K = 1 product with K padded to 2 by a zero row of A and
    of B: the sum is the same product, but XLA runs it as a GEMM, where K = 1
    becomes an elementwise multiply (see routing.pads_unit_k)."""
    nb = a.ndim - 2
    k_axis_a = nb + 1 if a_major == "k" else nb
    k_axis_b = nb + 1 if b_major == "k" else nb

    def pad(x, axis):
        return lax.pad(x, jnp.zeros((), x.dtype), [(0, 1 if i == axis else 0, 0) for i in range(x.ndim)])

    return xla_gemm(
        pad(a, k_axis_a), pad(b, k_axis_b), a_major=a_major, b_major=b_major, out_dtype=out_dtype, plan=plan, wide=False
    )


def routed_xla_gemm(a, b, *, a_major, b_major, out_dtype, plan):
    """XLA's dot on a GPU where no kernel runs the call: the product in the
    output dtype (cuBLAS accumulates in fp32 and rounds once), an fp32 result
    only for the dots XLA would degrade, and a K = 1 product padded to K = 2."""
    batch, m, n, k, _ = gemm_dims(a.shape, b.shape, a_major, b_major)
    if routing.pads_unit_k(m, n, k, math.prod(batch), a.dtype):
        return xla_gemm_padded_k(a, b, a_major=a_major, b_major=b_major, out_dtype=out_dtype, plan=plan)
    return xla_gemm(a, b, a_major=a_major, b_major=b_major, out_dtype=out_dtype, plan=plan, wide=_degenerate(m, n, k))


def _gemm_cuda_lowering(ctx, a, b, *, a_major, b_major, out_dtype, plan: Plan):
    if not _runs_kernel(plan):
        fallback = functools.partial(routed_xla_gemm, a_major=a_major, b_major=b_major, out_dtype=out_dtype, plan=plan)
        return mlir.lower_fun(fallback, multiple_results=False)(ctx, a, b)
    return lower_kernel_call(ctx, FFI_TARGETS["gemm"], plan, a, b)


gemm_local_p = local_primitive(
    "jax_cluster_gemm_local", abstract_eval=_gemm_abstract_eval, xla_impl=xla_gemm, cuda_lowering=_gemm_cuda_lowering
)


# --------------------------------------------------------------------------- fused epilogue


def _epilogue_abstract_eval(a, b, bias, c, *, b_major, out_dtype, alpha, beta, activation, plan):
    n = b.shape[1] if b_major == "n" else b.shape[0]
    return jax.core.ShapedArray((a.shape[0], n), out_dtype)


def xla_epilogue(a, b, bias, c, *, b_major, out_dtype, alpha, beta, activation, plan):
    """The portable path: the same formula on XLA's dot."""
    z = xla_gemm(a, b, a_major="k", b_major=b_major, out_dtype=np.float32, plan=plan)
    return apply_epilogue(z, bias, c, alpha=alpha, beta=beta, activation=activation, out_dtype=out_dtype)


def routed_xla_epilogue(a, b, bias, c, *, b_major, out_dtype, alpha, beta, activation, plan):
    """XLA's path on a GPU where no kernel runs the call: the graph behind
    nnx.Linear and its activation, XLA's dot in the output dtype and the
    epilogue in it, which XLA fuses as it fuses Flax's layer. An fp32 product
    (`xla_epilogue`) would write twice D's bytes and add a pass for the bias:
    a routed layer would lose to the Flax layer it replaces."""
    z = routed_xla_gemm(a, b, a_major="k", b_major=b_major, out_dtype=out_dtype, plan=plan)
    bias, c = (x if x.size else None for x in (bias, c))  # a zero-size placeholder is absent
    return epilogue_in_dtype(z, bias, c, alpha=alpha, beta=beta, activation=activation)


def _epilogue_cuda_lowering(ctx, a, b, bias, c, *, b_major, out_dtype, alpha, beta, activation, plan: Plan):
    if not _runs_kernel(plan):
        params = dict(b_major=b_major, out_dtype=out_dtype, alpha=alpha, beta=beta, activation=activation, plan=plan)
        return mlir.lower_fun(functools.partial(routed_xla_epilogue, **params), multiple_results=False)(
            ctx, a, b, bias, c
        )
    return lower_kernel_call(
        ctx,
        FFI_TARGETS["gemm_epilogue"],
        plan,
        a,
        b,
        bias,
        c,
        alpha=np.float32(alpha),
        beta=np.float32(beta),
        activation=np.int32(ACTIVATIONS[activation]),
    )


epilogue_local_p = local_primitive(
    "jax_cluster_gemm_epilogue_local",
    abstract_eval=_epilogue_abstract_eval,
    xla_impl=xla_epilogue,
    cuda_lowering=_epilogue_cuda_lowering,
)


# --------------------------------------------------------------------------- block-scaled fp8


def _scaled_abstract_eval(a, b, scale_a, scale_b, *, out_dtype, plan):
    return jax.core.ShapedArray((a.shape[0], b.shape[0]), out_dtype)


def block_scales(scales, rows: int, block: int):
    """Per-block scales [blocks_k, blocks_rows] expanded to one per element
    [rows, blocks_k * SCALE_BLOCK]: `block` rows share a scale."""
    per_row = jnp.repeat(scales.T, block, axis=0)[:rows] if block > 1 else scales.T
    return jnp.repeat(per_row, SCALE_BLOCK, axis=1)


def xla_scaled_gemm(a, b, scale_a, scale_b, *, out_dtype, plan):
    """The portable path: the dequantized operands' product in float32. The
    scales' dtype names their format: float32 blocks of 128 (e4m3), or e8m0
    blocks of 32 in the sm100 kernel's layout (mxe4m3)."""
    if mx_scales.is_mx_scale(scale_a):
        a32, b32 = mx_scales.dequantized(a, scale_a), mx_scales.dequantized(b, scale_b)
    else:
        a32 = a.astype(jnp.float32) * block_scales(scale_a, a.shape[0], 1)
        b32 = b.astype(jnp.float32) * block_scales(scale_b, b.shape[0], SCALE_BLOCK)
    out = lax.dot_general(a32, b32, (((1,), (1,)), ((), ())), precision=lax.Precision.HIGHEST)
    return out.astype(out_dtype)


def _scaled_cuda_lowering(ctx, a, b, scale_a, scale_b, *, out_dtype, plan: Plan):
    if not _runs_kernel(plan):
        fallback = functools.partial(xla_scaled_gemm, out_dtype=out_dtype, plan=plan)
        return mlir.lower_fun(fallback, multiple_results=False)(ctx, a, b, scale_a, scale_b)
    return lower_kernel_call(ctx, FFI_TARGETS["scaled_gemm"], plan, a, b, scale_a, scale_b)


scaled_gemm_local_p = local_primitive(
    "jax_cluster_scaled_gemm_local",
    abstract_eval=_scaled_abstract_eval,
    xla_impl=xla_scaled_gemm,
    cuda_lowering=_scaled_cuda_lowering,
)


# --------------------------------------------------------------------------- grouped


def clamp_group_sizes(group_sizes, rows):
    """Sizes under the documented rule: a negative size counts as 0 and groups
    are cut at `rows`, so group g covers [min(s_g, rows), min(s_g + size_g, rows))."""
    if group_sizes.shape[0] == 0:
        return group_sizes
    sizes = jnp.clip(group_sizes, 0, rows)  # cutting each at `rows` first changes no end
    # a running sum that saturates at `rows` never overflows int32, whatever G is
    ends = lax.associative_scan(lambda x, y: jnp.minimum(x + y, rows), sizes)
    return ends - jnp.concatenate([jnp.zeros((1,), ends.dtype), ends[:-1]])


def _ragged_abstract_eval(a, b, group_sizes, *, problem, b_major, out_dtype, plan):
    shape = ragged_out_shape(a.shape, b.shape, group_sizes.shape[0], problem, b_major)
    return jax.core.ShapedArray(shape, out_dtype)


def xla_ragged(a, b, group_sizes, *, problem, b_major, out_dtype, plan, wide=True, tiled=False):
    """The portable path: lax.ragged_dot_general on the clamped sizes.

    `wide`: an fp32 result, cast, as in `xla_gemm`. On a GPU XLA's dense
    expansion accumulates each output in fp32 either way (one group's dot per
    element), and the fp32 result widens the expansion's intermediate: the
    routed MoE products of train_block's small step spent 20.7 against
    lax.ragged_dot's 15.3 us in that reduction (2026-12-03).
    `tiled`: the loop over (row tile, group) pieces instead (tiled_ragged.py),
    on the CPU, where XLA's expansion costs G times the product (a TPU has
    XLA's own grouped product; a GPU would run the loop's pieces one by one)."""
    out_shape = ragged_out_shape(a.shape, b.shape, group_sizes.shape[0], problem, b_major)
    if group_sizes.shape[0] == 0:  # no groups: every row is past the last one
        return jnp.zeros(out_shape, out_dtype)
    sizes = clamp_group_sizes(group_sizes, a.shape[0])
    if tiled and a.shape[0]:
        if problem == "ragged_m":
            return tiled_ragged_m(a, b, sizes, b_major=b_major).astype(out_dtype)
        return tiled_ragged_k(a, b, sizes).astype(out_dtype)
    if problem == "ragged_m":
        contract_b = 1 if b_major == "n" else 2
        dims = lax.RaggedDotDimensionNumbers(
            (((1,), (contract_b,)), ((), ())), lhs_ragged_dimensions=[0], rhs_group_dimensions=[0]
        )
    else:  # the rows are the contraction: a ragged contracting dimension
        dims = lax.RaggedDotDimensionNumbers(
            (((0,), (0,)), ((), ())), lhs_ragged_dimensions=[0], rhs_group_dimensions=[]
        )
    out = lax.ragged_dot_general(a, b, sizes, dims, preferred_element_type=jnp.float32 if wide else out_dtype)
    return out.astype(out_dtype)


def _ragged_cuda_lowering(ctx, a, b, group_sizes, *, problem, b_major, out_dtype, plan: Plan):
    if not _runs_kernel(plan):
        (rows, width), b_shape = ctx.avals_in[0].shape, ctx.avals_in[1].shape
        if problem == "ragged_m":  # the expansion's dot: [rows, K] against each group's [K, N]
            m, n, k = rows, b_shape[2] if b_major == "n" else b_shape[1], width
        else:  # each group's [K', N'] over the rows
            m, n, k = width, b_shape[1], rows
        fallback = functools.partial(
            xla_ragged, problem=problem, b_major=b_major, out_dtype=out_dtype, plan=plan, wide=_degenerate(m, n, k)
        )
        return mlir.lower_fun(fallback, multiple_results=False)(ctx, a, b, group_sizes)
    # the raw sizes go to the kernel, which applies the same clamping rule itself
    return lower_kernel_call(ctx, FFI_TARGETS["ragged_dot"], plan, a, b, group_sizes)


ragged_local_p = local_primitive(
    "jax_cluster_ragged_dot_local",
    abstract_eval=_ragged_abstract_eval,
    xla_impl=xla_ragged,
    cpu_impl=functools.partial(xla_ragged, tiled=True),
    cuda_lowering=_ragged_cuda_lowering,
)


# --------------------------------------------------------------------------- gated grouped


def gate_product(z, activation, out_dtype):
    """act(gate) * up of z [..., 2H] in gate and up blocks of GATE_BLOCK columns, in float32."""
    gate, up = deinterleave(z.astype(jnp.float32))
    return (activation_fn(activation)(gate) * up).astype(out_dtype)


def _gated_abstract_eval(a, b, group_sizes, *, b_major, activation, out_dtype, plan):
    rows, n = ragged_out_shape(a.shape, b.shape, group_sizes.shape[0], "ragged_m", b_major)
    return jax.core.ShapedArray((rows, n // 2), out_dtype)


def xla_gated(a, b, group_sizes, *, b_major, activation, out_dtype, plan, tiled=False):
    """The portable path: the fp32 grouped product, then the gate (what the
    kernel's epilogue does with its fp32 accumulators)."""
    z = xla_ragged(a, b, group_sizes, problem="ragged_m", b_major=b_major, out_dtype=np.float32, plan=plan, tiled=tiled)
    return gate_product(z, activation, out_dtype)


def _gated_cuda_lowering(ctx, a, b, group_sizes, *, b_major, activation, out_dtype, plan: Plan):
    if not _runs_kernel(plan):
        fallback = functools.partial(xla_gated, b_major=b_major, activation=activation, out_dtype=out_dtype, plan=plan)
        return mlir.lower_fun(fallback, multiple_results=False)(ctx, a, b, group_sizes)
    return lower_kernel_call(
        ctx, FFI_TARGETS["gated_ragged_dot"], plan, a, b, group_sizes, activation=np.int32(ACTIVATIONS[activation])
    )


gated_local_p = local_primitive(
    "jax_cluster_gated_ragged_dot_local",
    abstract_eval=_gated_abstract_eval,
    xla_impl=xla_gated,
    cpu_impl=functools.partial(xla_gated, tiled=True),
    cuda_lowering=_gated_cuda_lowering,
)


# --------------------------------------------------------------------------- block-scaled fp8, grouped


def _scaled_ragged_abstract_eval(a, b, scale_a, scale_b, group_sizes, *, problem, out_dtype, plan):
    if problem == "ragged_m":
        return jax.core.ShapedArray((a.shape[0], b.shape[1]), out_dtype)
    return jax.core.ShapedArray((group_sizes.shape[0], a.shape[0], b.shape[0]), out_dtype)


def xla_scaled_ragged(a, b, scale_a, scale_b, group_sizes, *, problem="ragged_m", out_dtype, plan, tiled=False):
    """The portable path: the grouped product of the dequantized operands in
    float32, under the kernels' size rule (and, for ragged_k, their
    block-aligned rows: primitives/token_tiles.py). `tiled` as in xla_ragged."""
    if problem == "ragged_k":
        return _xla_scaled_ragged_k(a, b, scale_a, scale_b, group_sizes, out_dtype, tiled)
    rows, n = a.shape[0], b.shape[1]
    if group_sizes.shape[0] == 0:
        return jnp.zeros((rows, n), out_dtype)
    sizes = clamp_group_sizes(group_sizes, rows)
    if mx_scales.is_mx_scale(scale_a):  # e8m0 scales in the MX grouped kernel's layouts
        a32 = mx_scales.grouped_dequantized(a, scale_a, sizes)
        b32 = jax.vmap(mx_scales.dequantized)(b, scale_b)
    else:
        a32 = a.astype(jnp.float32) * block_scales(scale_a.T, rows, 1)  # scale_a is [rows, K/128]
        b32 = b.astype(jnp.float32) * jax.vmap(lambda s: block_scales(s, n, SCALE_BLOCK))(scale_b)
    if tiled and rows:
        return tiled_ragged_m(a32, b32, sizes, b_major="k", precision=lax.Precision.HIGHEST).astype(out_dtype)
    dims = lax.RaggedDotDimensionNumbers((((1,), (2,)), ((), ())), lhs_ragged_dimensions=[0], rhs_group_dimensions=[0])
    out = lax.ragged_dot_general(
        a32, b32, sizes, dims, precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32
    )
    return out.astype(out_dtype)


def _xla_scaled_ragged_k(a, b, scale_a, scale_b, group_sizes, out_dtype, tiled):
    """A [K', rows] and B [N', rows] in token tiles (scales [rows/128, K'] and
    [rows/128, N'], or MX's in the kernel layout) -> [G, K', N'], each group
    over its block-aligned rows."""
    (m, rows), n, groups = a.shape, b.shape[0], group_sizes.shape[0]
    if groups == 0:
        return jnp.zeros((0, m, n), out_dtype)
    _, valid = token_tiles.row_owners(group_sizes, rows)

    def rows_of(x, scales):  # [rows, C] float32, the rows outside every group zero
        if mx_scales.is_mx_scale(scales):  # e8m0 per 32 rows, the whole operand's kernel layout
            x32 = mx_scales.dequantized(x, scales).T
        else:
            x32 = x.T.astype(jnp.float32) * jnp.repeat(scales, SCALE_BLOCK, axis=0)
        return jnp.where(valid[:, None], x32, 0.0)

    spans = token_tiles.group_spans(group_sizes, rows)
    if tiled and rows:
        out = tiled_ragged_k(rows_of(a, scale_a), rows_of(b, scale_b), spans, precision=lax.Precision.HIGHEST)
        return out.astype(out_dtype)
    dims = lax.RaggedDotDimensionNumbers((((0,), (0,)), ((), ())), lhs_ragged_dimensions=[0], rhs_group_dimensions=[])
    out = lax.ragged_dot_general(
        rows_of(a, scale_a),
        rows_of(b, scale_b),
        spans,
        dims,
        precision=lax.Precision.HIGHEST,
        preferred_element_type=jnp.float32,
    )
    return out.astype(out_dtype)


def _scaled_ragged_cuda_lowering(ctx, a, b, scale_a, scale_b, group_sizes, *, problem, out_dtype, plan: Plan):
    if not _runs_kernel(plan):
        fallback = functools.partial(xla_scaled_ragged, problem=problem, out_dtype=out_dtype, plan=plan)
        return mlir.lower_fun(fallback, multiple_results=False)(ctx, a, b, scale_a, scale_b, group_sizes)
    # the raw sizes go to the kernel, which applies the same clamping rule itself
    return lower_kernel_call(ctx, FFI_TARGETS["scaled_ragged_dot"], plan, a, b, scale_a, scale_b, group_sizes)


scaled_ragged_local_p = local_primitive(
    "jax_cluster_scaled_ragged_dot_local",
    abstract_eval=_scaled_ragged_abstract_eval,
    xla_impl=xla_scaled_ragged,
    cpu_impl=functools.partial(xla_scaled_ragged, tiled=True),
    cuda_lowering=_scaled_ragged_cuda_lowering,
)
