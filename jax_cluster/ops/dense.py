"""The dense ops: `matmul` and `dot_general` validate and normalise layouts,
then hand over to gemm_p; `plan` says what such a call would run."""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from jax_cluster.ops import output_sharding
from jax_cluster.ops.fp8_dense import scaled_product
from jax_cluster.ops.precision import check_precision, needs_xla
from jax_cluster.ops.quantize import dequantize, dequantize_integer_operands, quantized_operands
from jax_cluster.planning.call import Call
from jax_cluster.planning.dense import plan_gemm
from jax_cluster.planning.plan import Plan, dtype_name
from jax_cluster.primitives import plans
from jax_cluster.primitives.gemm import gemm
from jax_cluster.primitives.operands import SUPPORTED_DTYPES


def _primitive_takes(*dtypes) -> bool:
    """Whether gemm_p takes these dtypes; everything else jnp computes is XLA's alone."""
    return all(d is None or jnp.dtype(d) in SUPPORTED_DTYPES for d in dtypes)


def matmul(a, b, *, out_dtype=None, plan: Plan | None = None, precision=None, preferred_element_type=None):
    """`a @ b` with NumPy matmul semantics on a cluster-persistent kernel.

    a is [..., M, K] and b is [K, N] or [..., K, N] (batch dims broadcast);
    1-D operands are promoted as in `jnp.matmul`. Mixed input dtypes promote
    as jnp's do. `out_dtype` (or jnp's `preferred_element_type`) defaults to
    the promoted input dtype; accumulation is fp32. `plan` pins the choices
    (see `jax_cluster.plan`); it must be made for the call's flattened problem.
    Whatever the kernels' primitive does not take (integers, float64,
    complex), and a `precision` asked of inputs wider than 16 bits, is
    `jnp.matmul` with `precision` passed on (bf16 and fp16 products are exact
    in the kernels' fp32 accumulators, so there it changes nothing).

    Block-scaled fp8 operands (`jax_cluster.quantize`: a in (1, 128) blocks,
    b [K, N] in (128, 128)) give a bfloat16 result by default. They run on
    the block-scaled fp8 kernel where its plan takes the call (a plan from
    `jax_cluster.plan(M, N, K, dtype=jnp.float8_e4m3fn, out_dtype=jnp.bfloat16,
    b_major="k")` pins it); elsewhere they are dequantized to bfloat16 and
    run the bf16 path (with `plan`, if one is given for it). QArrays of
    integer values (qwix's int8, int4) are dequantized in their scales' dtype.
    """
    check_precision("jax_cluster.matmul", precision)
    a, b = dequantize_integer_operands(a, b)
    fp8 = quantized_operands("jax_cluster.matmul", a, b)
    if fp8 is not None:
        out = out_dtype if out_dtype is not None else preferred_element_type
        out = out if out is not None else jnp.bfloat16
        if fp8[1].qvalue.ndim == 2:
            product = scaled_product(*fp8, 0, out, plan)
            if product is not None:
                return product
        return matmul(*(dequantize(q, jnp.bfloat16) for q in fp8), out_dtype=out, plan=plan)
    a, b = jnp.asarray(a), jnp.asarray(b)
    if (
        out_dtype is not None
        and preferred_element_type is not None
        and (jnp.dtype(out_dtype) != jnp.dtype(preferred_element_type))
    ):
        raise ValueError("jax_cluster.matmul: out_dtype and preferred_element_type disagree; pass one")
    out_dtype = out_dtype if out_dtype is not None else preferred_element_type
    dtype = jnp.result_type(a, b)
    if a.ndim == 0 or b.ndim == 0 or not _primitive_takes(dtype, out_dtype) or needs_xla(precision, dtype):
        return jnp.matmul(a, b, precision=precision, preferred_element_type=out_dtype)
    a, b = a.astype(dtype), b.astype(dtype)
    squeeze = []
    if a.ndim == 1:
        a, squeeze = a[None, :], squeeze + [-2]
    if b.ndim == 1:
        b, squeeze = b[:, None], squeeze + [-1]
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(
            f"jax_cluster.matmul: contracting dimensions differ: a {a.shape} has "
            f"K={a.shape[-1]}, b {b.shape} has K={b.shape[-2]}"
        )
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if b.ndim == 2:  # one weight: every leading dim of a folds into M for free
        lead = a.shape[:-2]
        rows = math.prod(lead) * m  # spelled out: a -1 cannot be inferred when K = 0
        out = gemm(a.reshape(rows, k), b, a_major="k", b_major="n", out_dtype=out_dtype, plan=plan)
        out = out.reshape(*lead, m, n)
    else:
        batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        count = math.prod(batch)
        a3 = jnp.broadcast_to(a, (*batch, m, k)).reshape(count, m, k)
        b3 = jnp.broadcast_to(b, (*batch, k, n)).reshape(count, k, n)
        out = gemm(a3, b3, a_major="k", b_major="n", out_dtype=out_dtype, plan=plan)
        out = out.reshape(*batch, m, n)
    for axis in squeeze:
        out = jnp.squeeze(out, axis=axis if len(squeeze) == 1 else -1)
    return out


def _as_gemm(lhs, rhs, dimension_numbers):
    """(a, b, a_major, b_major, out_shape) when the dot maps onto the kernel
    without copies, else None."""
    (lc, rc), (lb, rb) = dimension_numbers
    nb = len(lb)
    if len(lc) != 1 or len(rc) != 1 or tuple(lb) != tuple(range(nb)) or tuple(rb) != tuple(range(nb)):
        return None
    (lc,), (rc,) = lc, rc
    batch = lhs.shape[:nb]
    if lc == lhs.ndim - 1 and lhs.ndim > nb + 1:
        a_major, lhs_free = "k", lhs.shape[nb:-1]
    elif lc == nb and lhs.ndim == nb + 2:
        a_major, lhs_free = "m", lhs.shape[nb + 1 :]
    else:
        return None
    if rc == nb and rhs.ndim > nb + 1:
        b_major, rhs_free = "n", rhs.shape[nb + 1 :]
    elif rc == rhs.ndim - 1 and rhs.ndim > nb + 1:
        b_major, rhs_free = "k", rhs.shape[nb:-1]
    else:
        return None
    m, n, k = math.prod(lhs_free), math.prod(rhs_free), lhs.shape[lc]
    lead = (math.prod(batch),) if nb else ()
    a = lhs.reshape(*lead, *((m, k) if a_major == "k" else (k, m)))
    b = rhs.reshape(*lead, *((n, k) if b_major == "k" else (k, n)))
    return a, b, a_major, b_major, (*batch, *lhs_free, *rhs_free)


def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, out_sharding=None):
    """Drop-in for `lax.dot_general` (and Flax's `dot_general=` hook).

    Dots with one contracting dimension and leading batch dimensions run on
    the kernel; every other form, mixed input dtypes, dtypes the kernels'
    primitive does not take (integers, float64, complex) and a `precision`
    asked of inputs wider than 16 bits go to `lax.dot_general` unchanged.
    `out_sharding` (which `nnx.Linear` passes, None by default) is applied to
    the kernel's output; only when it is given and a mesh with explicit axes
    is set or typed into the operands does the call go to `lax.dot_general`,
    which types the sharding.

    Block-scaled fp8 operands (`jax_cluster.quantize`) are taken in the
    matmul form only: lhs [..., M, K] in (1, 128) blocks contracting its last
    axis, rhs [K, N] or [N, K] in (128, 128) blocks, no batch dimensions;
    the result is bfloat16 by default and runs as in `matmul`. QArrays of
    integer values (qwix's int8, int4) are dequantized in their scales' dtype.
    """
    check_precision("jax_cluster.dot_general", precision)
    lhs, rhs = dequantize_integer_operands(lhs, rhs)
    fp8 = quantized_operands("jax_cluster.dot_general", lhs, rhs)
    if fp8 is not None:
        _check_fp8_form(fp8[0].qvalue.ndim, fp8[1].qvalue.ndim, dimension_numbers)
        out = preferred_element_type if preferred_element_type is not None else jnp.bfloat16
        if out_sharding is None:
            product = scaled_product(*fp8, dimension_numbers[0][1][0], out, None)
            if product is not None:
                return product
        values = tuple(dequantize(q, jnp.bfloat16) for q in fp8)
        return dot_general(*values, dimension_numbers, precision, out, out_sharding)
    lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
    mapped = None
    takes = (
        lhs.dtype == rhs.dtype
        and _primitive_takes(lhs.dtype, preferred_element_type)
        and not needs_xla(precision, lhs.dtype)
    )
    if takes and not output_sharding.explicit_mesh(lhs, rhs, out_sharding):
        mapped = _as_gemm(lhs, rhs, dimension_numbers)
    if mapped is None:
        return lax.dot_general(
            lhs,
            rhs,
            dimension_numbers,
            precision=precision,
            preferred_element_type=preferred_element_type,
            out_sharding=out_sharding,
        )
    a, b, a_major, b_major, out_shape = mapped
    out = gemm(a, b, a_major=a_major, b_major=b_major, out_dtype=preferred_element_type)
    out = out.reshape(out_shape)
    if output_sharding.constrains(out_sharding, "jax_cluster.dot_general"):
        out = output_sharding.place(out, out_sharding)
    return out


def _check_fp8_form(lhs_ndim, rhs_ndim, dimension_numbers):
    """The forms whose contraction runs along the blocks' 128-wide K tiles."""
    (lc, rc), (lb, rb) = dimension_numbers
    if lb or rb or rhs_ndim != 2 or tuple(lc) != (lhs_ndim - 1,) or len(rc) != 1:
        raise ValueError(
            "jax_cluster.dot_general: fp8 operands take the matmul form only (lhs [..., M, K] contracting "
            f"its last axis, rhs [K, N] or [N, K], no batch dimensions), got {dimension_numbers} "
            f"for ranks {lhs_ndim} and {rhs_ndim}"
        )


def plan(
    m: int,
    n: int,
    k: int,
    *,
    dtype,
    out_dtype=None,
    batch: int = 1,
    device=None,
    a_major: str = "k",
    b_major: str = "n",
    **overrides,
) -> Plan:
    """The plan `jax_cluster.matmul` would use for A [M,K] @ B [K,N] (by default).

    `device` is a jax Device or a `DeviceInfo` (to plan for a GPU that is not
    present). Keyword overrides pin choices (see `planning.dense.plan_gemm`);
    without them the answer is what a call gets, the autotune cache's entry
    included when reading it is on.
    """
    if overrides:
        return plan_gemm(
            m,
            n,
            k,
            dtype=dtype,
            out_dtype=out_dtype,
            batch=batch,
            a_major=a_major,
            b_major=b_major,
            device=device,
            **overrides,
        )
    out = dtype_name(out_dtype if out_dtype is not None else dtype)
    call = Call("dense", int(m), int(n), int(k), int(batch), a_major, b_major, dtype_name(dtype), out)
    return plans.fresh(call, device)
