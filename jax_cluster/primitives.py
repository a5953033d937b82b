"""gemm_p: shape rules, autodiff, batching and lowering of the dense GEMM.

Operands are rank 2, or rank 3 with a shared leading batch. `a_major` says
how A is stored ("k": [M,K]; "m": [K,M]) and `b_major` how B is ("k": [N,K];
"n": [K,N]); the kernel reads either in place, so transposes never copy.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from jax_cluster.local_primitives import gemm_dims as _dims
from jax_cluster.partition_gemm import sharded_gemm
from jax_cluster.partition_specs import lowers_through_custom_partitioning
from jax_cluster.plan import Plan, dtype_name, plan_gemm

SUPPORTED_DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)

gemm_p = Primitive("jax_cluster_gemm")


def check_dtypes(who, out_dtype, **operands):
    """The dtype rules every primitive here shares: two operands by their labels."""
    for name, x in operands.items():
        if not any(x.dtype == np.dtype(t) for t in SUPPORTED_DTYPES):
            raise TypeError(f"{who}: unsupported dtype {x.dtype} for {name}; "
                            "use bfloat16, float16 or float32")
    (na, a), (nb, b) = operands.items()
    if a.dtype != b.dtype:
        raise TypeError(f"{who}: {na} and {nb} dtypes differ ({a.dtype} vs {b.dtype})")
    if not any(np.dtype(out_dtype) == np.dtype(t) for t in SUPPORTED_DTYPES):
        raise TypeError(f"{who}: unsupported output dtype {np.dtype(out_dtype)}")


def _check(a, b, a_major, b_major, out_dtype):
    if a_major not in ("k", "m") or b_major not in ("k", "n"):
        raise ValueError(f"jax_cluster gemm: a_major must be 'k' or 'm' and b_major 'k' or 'n', "
                         f"got {a_major!r}, {b_major!r}")
    if a.ndim not in (2, 3) or b.ndim != a.ndim:
        raise ValueError(f"jax_cluster gemm: operands must both be rank 2 (or rank 3 with a "
                         f"leading batch); got shapes {a.shape} and {b.shape}")
    check_dtypes("jax_cluster gemm", out_dtype, A=a, B=b)
    batch, m, n, ka, kb = _dims(a.shape, b.shape, a_major, b_major)
    if ka != kb:
        raise ValueError(f"jax_cluster gemm: contracting dimensions differ: A {a.shape} "
                         f"({a_major}-major) has K={ka}, B {b.shape} ({b_major}-major) has K={kb}")
    if a.ndim == 3 and a.shape[0] != b.shape[0]:
        raise ValueError(f"jax_cluster gemm: batch sizes differ: {a.shape[0]} vs {b.shape[0]}")
    return (*batch, m, n)


def _abstract_eval(a, b, *, a_major, b_major, out_dtype, plan):
    return jax.core.ShapedArray(_check(a, b, a_major, b_major, out_dtype), out_dtype)


def _lowering(ctx, a, b, *, a_major, b_major, out_dtype, plan):
    """Through custom_partitioning, so a sharded call runs one planned GEMM per shard."""
    return mlir.lower_fun(
        lambda a, b: sharded_gemm(a, b, a_major, b_major, np.dtype(out_dtype), plan),
        multiple_results=False)(ctx, a, b)


gemm_p.def_impl(functools.partial(jax.jit, static_argnames=("a_major", "b_major", "out_dtype",
                                                             "plan"))(
    lambda a, b, **params: gemm_p.bind(a, b, **params)))
gemm_p.def_abstract_eval(_abstract_eval)
mlir.register_lowering(gemm_p, _lowering)
lowers_through_custom_partitioning(gemm_p)


# --------------------------------------------------------------------------- binding


def gemm(a, b, *, a_major="k", b_major="n", out_dtype=None, plan: Plan | None = None,
         device=None):
    """Binds gemm_p, planning the call if no plan is given."""
    out_dtype = np.dtype(out_dtype if out_dtype is not None else a.dtype)
    batch, m, n, k, _ = _dims(a.shape, b.shape, a_major, b_major)
    nbatch = int(np.prod(batch)) if batch else 1
    call = (m, n, k, nbatch, a_major, b_major, dtype_name(a.dtype), dtype_name(out_dtype))
    if plan is None:
        plan = plan_gemm(m, n, k, dtype=a.dtype, out_dtype=out_dtype, batch=nbatch,
                         a_major=a_major, b_major=b_major, device=device)
    elif plan.problem != "dense":
        raise ValueError(f"jax_cluster: a {plan.problem} plan (from plan_ragged) cannot run a "
                         "dense GEMM")
    elif (plan.m, plan.n, plan.k, plan.batch, plan.a_major, plan.b_major, plan.dtype,
          plan.out_dtype) != call:
        raise ValueError(f"jax_cluster: the plan was made for M={plan.m} N={plan.n} K={plan.k} "
                         f"batch={plan.batch} A {plan.a_major}-major B {plan.b_major}-major "
                         f"{plan.dtype}->{plan.out_dtype}, but this call is M={m} N={n} K={k} "
                         f"batch={nbatch} A {a_major}-major B {b_major}-major {call[6]}->{call[7]}")
    return gemm_p.bind(a, b, a_major=a_major, b_major=b_major, out_dtype=out_dtype, plan=plan)


# --------------------------------------------------------------------------- autodiff

_FLIP_B = {"k": "n", "n": "k"}


def _ct_as(ct, like):
    """Cotangent in the operand dtype: the kernels take one input dtype."""
    return ct.astype(like.aval.dtype)


def _transpose_a(ct, a, b, *, a_major, b_major, out_dtype, plan):
    ct = _ct_as(ct, a)
    dev = plan.device
    if a_major == "k":   # dA[M,K] = dC[M,N] . B^T
        da = gemm(ct, b, a_major="k", b_major=_FLIP_B[b_major], out_dtype=a.aval.dtype, device=dev)
    else:                # dA[K,M] = B . dC^T
        da = gemm(b, ct, a_major="k" if b_major == "n" else "m", b_major="k",
                  out_dtype=a.aval.dtype, device=dev)
    return da


def _transpose_b(ct, a, b, *, a_major, b_major, out_dtype, plan):
    ct = _ct_as(ct, b)
    dev = plan.device
    if b_major == "n":   # dB[K,N] = A^T . dC
        db = gemm(a, ct, a_major="m" if a_major == "k" else "k", b_major="n",
                  out_dtype=b.aval.dtype, device=dev)
    else:                # dB[N,K] = dC^T . A
        db = gemm(ct, a, a_major="m", b_major="n" if a_major == "k" else "k",
                  out_dtype=b.aval.dtype, device=dev)
    return db


ad.defbilinear(gemm_p, _transpose_a, _transpose_b)


# --------------------------------------------------------------------------- batching


def _batch_rule(args, dims, *, a_major, b_major, out_dtype, plan):
    """dims[i] is the vmapped axis of operand i, or None when it is shared."""
    a, b = args
    da, db = dims
    dev = plan.device
    if db is None and a.ndim == 3 and a_major == "k":
        # B is shared: fold the vmapped axis into M, a free reshape.
        a = jnp.moveaxis(a, da, 0)
        v, m, k = a.shape
        out = gemm(a.reshape(v * m, k), b, a_major="k", b_major=b_major, out_dtype=out_dtype,
                   device=dev)
        return out.reshape(v, m, -1), 0
    size = a.shape[da] if da is not None else b.shape[db]
    a = batching.bdim_at_front(a, da, size)
    b = batching.bdim_at_front(b, db, size)
    merged = a.ndim == 4
    if merged:  # already batched: merge the vmapped axis into the batch
        a = a.reshape(-1, *a.shape[2:])
        b = b.reshape(-1, *b.shape[2:])
    out = gemm(a, b, a_major=a_major, b_major=b_major, out_dtype=out_dtype, device=dev)
    return (out.reshape(size, -1, *out.shape[-2:]) if merged else out), 0


batching.primitive_batchers[gemm_p] = _batch_rule
