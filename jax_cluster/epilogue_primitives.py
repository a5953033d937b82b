"""gemm_epilogue_p: D = act(alpha * A·B + beta * C + bias[n]) in one kernel.

A is [M,K]; B is [K,N] ("n") or [N,K] ("k"), read in place; bias is [N] and
C is [M,N], both in D's dtype, and either may be absent (a zero-size
placeholder, which is what the FFI handler reads as "none"). The activation
is picked at run time by the kernel ("bias_act" menu rows), so every
activation shares one compiled variant. The lowering goes through
custom_partitioning (partition_epilogue.py) to the one-device primitive
(local_primitives.py). Autodiff lives one level up (`jax_cluster.linear`),
which saves the pre-activation for the backward pass.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

from jax_cluster.local_primitives import ACTIVATIONS, activation_fn
from jax_cluster.partition_epilogue import sharded_epilogue
from jax_cluster.partition_specs import lowers_through_custom_partitioning
from jax_cluster.plan import Plan, dtype_name, plan_gemm
from jax_cluster.primitives import check_dtypes

gemm_epilogue_p = Primitive("jax_cluster_gemm_epilogue")


def _check(a, b, bias, c, *, b_major, out_dtype):
    if b_major not in ("n", "k"):
        raise ValueError(f"jax_cluster linear: b_major must be 'n' or 'k', got {b_major!r}")
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"jax_cluster linear: A and B must be rank 2, got {a.shape} and {b.shape}")
    check_dtypes("jax_cluster linear", out_dtype, A=a, B=b)
    m, k = a.shape
    n, kb = (b.shape[1], b.shape[0]) if b_major == "n" else b.shape
    if k != kb:
        raise ValueError(f"jax_cluster linear: contracting dimensions differ: A {a.shape}, "
                         f"B {b.shape} ({b_major}-major)")
    for name, x, shape in (("bias", bias, (n,)), ("C", c, (m, n))):
        if x.size and (x.shape != shape or x.dtype != np.dtype(out_dtype)):
            raise ValueError(f"jax_cluster linear: {name} must be {np.dtype(out_dtype)}{list(shape)}"
                             f", got {x.dtype}{list(x.shape)}")
    return m, n


def _abstract_eval(a, b, bias, c, *, b_major, out_dtype, alpha, beta, activation, plan):
    return jax.core.ShapedArray(_check(a, b, bias, c, b_major=b_major, out_dtype=out_dtype),
                                out_dtype)


def _lowering(ctx, a, b, bias, c, *, b_major, out_dtype, alpha, beta, activation, plan):
    """Through custom_partitioning, so a sharded call runs one planned kernel per shard."""
    return mlir.lower_fun(
        lambda a, b, bias, c: sharded_epilogue(a, b, bias, c, b_major, np.dtype(out_dtype),
                                               alpha, beta, activation, plan),
        multiple_results=False)(ctx, a, b, bias, c)


gemm_epilogue_p.def_impl(functools.partial(
    jax.jit, static_argnames=("b_major", "out_dtype", "alpha", "beta", "activation", "plan"))(
    lambda a, b, bias, c, **params: gemm_epilogue_p.bind(a, b, bias, c, **params)))
gemm_epilogue_p.def_abstract_eval(_abstract_eval)
mlir.register_lowering(gemm_epilogue_p, _lowering)
lowers_through_custom_partitioning(gemm_epilogue_p)


def gemm_epilogue(a, b, bias=None, c=None, *, b_major="n", out_dtype=None, alpha=1.0,
                  beta=0.0, activation="none", plan: Plan | None = None, device=None):
    """Binds gemm_epilogue_p, planning the call if no plan is given."""
    out_dtype = np.dtype(out_dtype if out_dtype is not None else a.dtype)
    if activation not in ACTIVATIONS:  # a clear error at trace time, not a lowering failure
        activation_fn(activation)
    if c is None and beta != 0:
        raise ValueError("jax_cluster linear: beta is not 0 but there is no residual")
    empty = jnp.zeros((0,), out_dtype)
    bias = empty if bias is None else bias
    c = empty if c is None else c
    m, n = _check(a, b, bias, c, b_major=b_major, out_dtype=out_dtype)
    k = a.shape[1]
    if plan is None:
        plan = plan_gemm(m, n, k, dtype=a.dtype, out_dtype=out_dtype, a_major="k",
                         b_major=b_major, device=device, epilogue="bias_act")
    elif (plan.m, plan.n, plan.k, plan.b_major, plan.dtype, plan.out_dtype, plan.epilogue) != (
            m, n, k, b_major, dtype_name(a.dtype), dtype_name(out_dtype), "bias_act"):
        raise ValueError(f"jax_cluster linear: the plan was made for M={plan.m} N={plan.n} "
                         f"K={plan.k} B {plan.b_major}-major {plan.dtype}->{plan.out_dtype} "
                         f"epilogue {plan.epilogue!r}, but this call is M={m} N={n} K={k} "
                         f"B {b_major}-major with a fused epilogue ('bias_act')")
    return gemm_epilogue_p.bind(a, b, bias, c, b_major=b_major, out_dtype=out_dtype,
                                alpha=float(alpha), beta=float(beta), activation=activation,
                                plan=plan)


def _batch_rule(args, dims, *, b_major, out_dtype, alpha, beta, activation, plan):
    """A vmapped A (and C) with shared B and bias folds into M; anything else loops."""
    a, b, bias, c = args
    da, db, dbias, dc = dims
    dev = plan.device
    if db is None and dbias is None and da is not None and (dc is None) == (c.size == 0):
        a = jnp.moveaxis(a, da, 0)
        v, m, k = a.shape
        c2 = jnp.moveaxis(c, dc, 0).reshape(v * m, -1) if c.size else None
        out = gemm_epilogue(a.reshape(v * m, k), b, bias if bias.size else None, c2,
                            b_major=b_major, out_dtype=out_dtype, alpha=alpha, beta=beta,
                            activation=activation, device=dev)
        return out.reshape(v, m, -1), 0
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    present = [x.size > 0 for x in args]  # bias and C may be absent (empty)
    stacked = [batching.bdim_at_front(x, d, size) for x, d, p in zip(args, dims, present) if p]

    def one(xs):
        it = iter(xs)
        a, b, bias, c = (next(it) if p else None for p in present)
        return gemm_epilogue(a, b, bias, c, b_major=b_major, out_dtype=out_dtype, alpha=alpha,
                             beta=beta, activation=activation, device=dev)

    return lax.map(one, stacked), 0


batching.primitive_batchers[gemm_epilogue_p] = _batch_rule
