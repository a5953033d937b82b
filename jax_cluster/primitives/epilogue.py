"""gemm_epilogue_p: D = act(alpha * A·B + beta * C + bias[n]) in one kernel.

A is [M,K]; B is [K,N] ("n") or [N,K] ("k"), read in place; bias is [N] and
C is [M,N], both in D's dtype, and either may be absent (a zero-size
placeholder, which is what the FFI handler reads as "none"). The activation
is picked at run time by the kernel ("bias_act" menu rows), so every
activation shares one compiled variant. Autodiff lives one level up
(`jax_cluster.linear`), which saves the pre-activation for the backward pass.

Over a mesh: factors A "m k", B "k n" (or "n k"), bias "n", C "m n" -> out "m n".
  M or N sharded -> one fused kernel per shard, with its slice of bias and C;
  K sharded      -> fp32 partial products, a psum, then the epilogue on XLA
                    (act(alpha*z + beta*C + bias) needs the whole sum first).
Absent bias or C have a factor of their own that is never split.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.interpreters import batching
from jax.sharding import NamedSharding

from jax_cluster.planning.call import Call
from jax_cluster.planning.plan import Plan
from jax_cluster.planning.tables import ACTIVATIONS
from jax_cluster.primitives import plans
from jax_cluster.primitives.activations import activation_fn, apply_epilogue
from jax_cluster.primitives.gemm import gemm_call
from jax_cluster.primitives.lowering import epilogue_local_p, gemm_local_p
from jax_cluster.primitives.operands import check_dtypes
from jax_cluster.primitives.registry import partitioned_primitive
from jax_cluster.primitives.specs import choose_axes, dim_axes, spec_of

_WHO = "jax_cluster linear"
_STATIC = ("b_major", "out_dtype", "alpha", "beta", "activation", "plan")


def _check(a, b, bias, c, *, b_major, out_dtype):
    if b_major not in ("n", "k"):
        raise ValueError(f"{_WHO}: b_major must be 'n' or 'k', got {b_major!r}")
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"{_WHO}: A and B must be rank 2, got {a.shape} and {b.shape}")
    check_dtypes(_WHO, out_dtype, A=a, B=b)
    m, k = a.shape
    n, kb = (b.shape[1], b.shape[0]) if b_major == "n" else b.shape
    if k != kb:
        raise ValueError(f"{_WHO}: contracting dimensions differ: A {a.shape}, B {b.shape} ({b_major}-major)")
    for name, x, shape in (("bias", bias, (n,)), ("C", c, (m, n))):
        if x.size and (x.shape != shape or x.dtype != np.dtype(out_dtype)):
            raise ValueError(f"{_WHO}: {name} must be {np.dtype(out_dtype)}{list(shape)}, got {x.dtype}{list(x.shape)}")
    return m, n


def _abstract_eval(a, b, bias, c, *, b_major, out_dtype, alpha, beta, activation, plan):
    return jax.core.ShapedArray(_check(a, b, bias, c, b_major=b_major, out_dtype=out_dtype), out_dtype)


def _epilogue_call(a_shape, b_shape, b_major, dtype, out_dtype) -> Call:
    call = gemm_call(a_shape, b_shape, "k", b_major, dtype, out_dtype)
    return dataclasses.replace(call, epilogue="bias_act")


# --------------------------------------------------------------------------- partitioning


def _factors(b_major, has_bias, has_c):
    b = ("k", "n") if b_major == "n" else ("n", "k")
    bias = ("n",) if has_bias else ("bias_absent",)
    c = ("m", "n") if has_c else ("c_absent",)
    return ("m", "k"), b, bias, c, ("m", "n")


def _whole(a, b, bias, c, b_major, out_dtype, alpha, beta, activation, plan):
    return epilogue_local_p.bind(
        a, b, bias, c, b_major=b_major, out_dtype=out_dtype, alpha=alpha, beta=beta, activation=activation, plan=plan
    )


def _sharding_rule(b_major, out_dtype, alpha, beta, activation, plan, mesh, operand_types, result_types):
    names = _factors(b_major, operand_types[2].shape[0] > 0, operand_types[3].shape[0] > 0)
    ins = ", ".join(" ".join(f) for f in names[:4])
    return f"{ins} -> {' '.join(names[4])}", {"reduction_factors": ("k",)}


def _partition(b_major, out_dtype, alpha, beta, activation, plan, mesh, arg_shapes, result_shape):
    a, b, bias, c = arg_shapes
    fa, fb, fbias, fc, fo = _factors(b_major, bias.shape[0] > 0, c.shape[0] > 0)
    on_a, on_b = dict(zip(fa, dim_axes(a))), dict(zip(fb, dim_axes(b)))
    sizes = {**dict(zip(fb, b.shape)), **dict(zip(fa, a.shape))}
    k_axes = on_a["k"] if on_a["k"] == on_b["k"] else ()
    chosen = choose_axes(mesh, [("m", on_a["m"]), ("n", on_b["n"]), ("k", k_axes)], sizes)
    out_dtype = np.dtype(out_dtype)
    k_split = chosen["k"]

    def per_shard(a, b, bias, c):
        if not k_split:
            p = plans.for_shard(plan, _epilogue_call(a.shape, b.shape, b_major, a.dtype, out_dtype))
            return epilogue_local_p.bind(
                a,
                b,
                bias,
                c,
                b_major=b_major,
                out_dtype=out_dtype,
                alpha=alpha,
                beta=beta,
                activation=activation,
                plan=p,
            )
        f32 = np.dtype(np.float32)
        p = plans.for_shard(plan, gemm_call(a.shape, b.shape, "k", b_major, a.dtype, f32))
        z = lax.psum(gemm_local_p.bind(a, b, a_major="k", b_major=b_major, out_dtype=f32, plan=p), k_split)
        return apply_epilogue(z, bias, c, alpha=alpha, beta=beta, activation=activation, out_dtype=out_dtype)

    arg_shardings = tuple(NamedSharding(mesh, spec_of(f, chosen)) for f in (fa, fb, fbias, fc))
    return mesh, per_shard, NamedSharding(mesh, spec_of(fo, chosen)), arg_shardings


# --------------------------------------------------------------------------- batching


def _batch_rule(args, dims, *, b_major, out_dtype, alpha, beta, activation, plan):
    """A vmapped A (and C) with shared B and bias folds into M; anything else loops."""
    a, b, bias, c = args
    da, db, dbias, dc = dims
    dev = plan.device
    if db is None and dbias is None and da is not None and (dc is None) == (c.size == 0):
        a = jnp.moveaxis(a, da, 0)
        v, m, k = a.shape
        c2 = jnp.moveaxis(c, dc, 0).reshape(v * m, -1) if c.size else None
        out = gemm_epilogue(
            a.reshape(v * m, k),
            b,
            bias if bias.size else None,
            c2,
            b_major=b_major,
            out_dtype=out_dtype,
            alpha=alpha,
            beta=beta,
            activation=activation,
            device=dev,
        )
        return out.reshape(v, m, -1), 0
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    present = [x.size > 0 for x in args]  # bias and C may be absent (empty)
    stacked = [batching.bdim_at_front(x, d, size) for x, d, p in zip(args, dims, present) if p]

    def one(xs):
        it = iter(xs)
        a, b, bias, c = (next(it) if p else None for p in present)
        return gemm_epilogue(
            a,
            b,
            bias,
            c,
            b_major=b_major,
            out_dtype=out_dtype,
            alpha=alpha,
            beta=beta,
            activation=activation,
            device=dev,
        )

    return lax.map(one, stacked), 0


gemm_epilogue_p = partitioned_primitive(
    "jax_cluster_gemm_epilogue",
    static=_STATIC,
    abstract_eval=_abstract_eval,
    whole=_whole,
    partition=_partition,
    sharding_rule=_sharding_rule,
    batch_rule=_batch_rule,
)


# --------------------------------------------------------------------------- binding


def gemm_epilogue(
    a,
    b,
    bias=None,
    c=None,
    *,
    b_major="n",
    out_dtype=None,
    alpha=1.0,
    beta=0.0,
    activation="none",
    plan: Plan | None = None,
    device=None,
):
    """Binds gemm_epilogue_p with `plan`, or with a fresh plan when none is given."""
    out_dtype = np.dtype(out_dtype if out_dtype is not None else a.dtype)
    if activation not in ACTIVATIONS:  # a clear error at trace time, not a lowering failure
        activation_fn(activation)
    if c is None and beta != 0:
        raise ValueError(f"{_WHO}: beta is not 0 but there is no residual")
    empty = jnp.zeros((0,), out_dtype)
    bias = empty if bias is None else bias
    c = empty if c is None else c
    _check(a, b, bias, c, b_major=b_major, out_dtype=out_dtype)
    call = _epilogue_call(a.shape, b.shape, b_major, a.dtype, out_dtype)
    plan = plans.choose(call, plan, device, _WHO)
    return gemm_epilogue_p.bind(
        a,
        b,
        bias,
        c,
        b_major=b_major,
        out_dtype=out_dtype,
        alpha=float(alpha),
        beta=float(beta),
        activation=activation,
        plan=plan,
    )
