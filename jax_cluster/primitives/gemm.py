"""gemm_p: shape rules, autodiff, batching and partitioning of the dense GEMM.

Operands are rank 2, or rank 3 with a shared leading batch. `a_major` says
how A is stored ("k": [M,K]; "m": [K,M]) and `b_major` how B is ("k": [N,K];
"n": [K,N]); the kernel reads either in place, so transposes never copy.

Over a mesh (custom_partitioning with a Shardy rule), each factor of the
product keeps the sharding its operands bring:
  batch, M, N sharded -> one local GEMM per shard, output sharded the same way;
  K sharded           -> local GEMMs into fp32 partials, then a psum.
Each shard is planned for its own local (m, n, k): a plan made for the global
shapes would pick the wrong tile and schedule, and the kernel checks them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.interpreters import ad, batching
from jax.sharding import NamedSharding

from jax_cluster.planning.call import Call
from jax_cluster.planning.plan import Plan, dtype_name
from jax_cluster.primitives import plans
from jax_cluster.primitives.lowering import gemm_local_p
from jax_cluster.primitives.operands import FLIP_B, check_dtypes, ct_as, gemm_dims
from jax_cluster.primitives.registry import partitioned_primitive
from jax_cluster.primitives.specs import choose_axes, dim_axes, spec_of

_WHO = "jax_cluster gemm"


def _check(a, b, a_major, b_major, out_dtype):
    if a_major not in ("k", "m") or b_major not in ("k", "n"):
        raise ValueError(f"{_WHO}: a_major must be 'k' or 'm' and b_major 'k' or 'n', got {a_major!r}, {b_major!r}")
    if a.ndim not in (2, 3) or b.ndim != a.ndim:
        raise ValueError(
            f"{_WHO}: operands must both be rank 2 (or rank 3 with a leading batch); got shapes {a.shape} and {b.shape}"
        )
    check_dtypes(_WHO, out_dtype, A=a, B=b)
    batch, m, n, ka, kb = gemm_dims(a.shape, b.shape, a_major, b_major)
    if ka != kb:
        raise ValueError(
            f"{_WHO}: contracting dimensions differ: A {a.shape} ({a_major}-major) has K={ka}, "
            f"B {b.shape} ({b_major}-major) has K={kb}"
        )
    if a.ndim == 3 and a.shape[0] != b.shape[0]:
        raise ValueError(f"{_WHO}: batch sizes differ: {a.shape[0]} vs {b.shape[0]}")
    return (*batch, m, n)


def gemm_call(a_shape, b_shape, a_major, b_major, dtype, out_dtype) -> Call:
    """The Call of a dense GEMM on operands of these shapes."""
    batch, m, n, k, _ = gemm_dims(a_shape, b_shape, a_major, b_major)
    count = int(np.prod(batch)) if batch else 1
    return Call("dense", m, n, k, count, a_major, b_major, dtype_name(dtype), dtype_name(out_dtype))


def _abstract_eval(a, b, *, a_major, b_major, out_dtype, plan):
    return jax.core.ShapedArray(_check(a, b, a_major, b_major, out_dtype), out_dtype)


# --------------------------------------------------------------------------- partitioning


def _factors(a_major, b_major, batched):
    """Factor names of A's, B's and the output's dimensions."""
    lead = ("b",) if batched else ()
    a = lead + (("m", "k") if a_major == "k" else ("k", "m"))
    b = lead + (("n", "k") if b_major == "k" else ("k", "n"))
    return a, b, lead + ("m", "n")


def _whole(a, b, a_major, b_major, out_dtype, plan):
    """The unpartitioned call (one device, or everything replicated)."""
    return gemm_local_p.bind(a, b, a_major=a_major, b_major=b_major, out_dtype=out_dtype, plan=plan)


def _sharding_rule(a_major, b_major, out_dtype, plan, mesh, operand_types, result_types):
    fa, fb, fo = _factors(a_major, b_major, len(operand_types[0].shape) == 3)
    return f"{' '.join(fa)}, {' '.join(fb)} -> {' '.join(fo)}", {"reduction_factors": ("k",)}


def _partition(a_major, b_major, out_dtype, plan, mesh, arg_shapes, result_shape):
    a, b = arg_shapes
    fa, fb, fo = _factors(a_major, b_major, len(a.shape) == 3)
    on_a, on_b = dict(zip(fa, dim_axes(a))), dict(zip(fb, dim_axes(b)))
    sizes = {**dict(zip(fb, b.shape)), **dict(zip(fa, a.shape))}
    # K stays split only when both operands agree on it; else it is gathered
    k_axes = on_a["k"] if on_a["k"] == on_b["k"] else ()
    candidates = [("b", on_a.get("b") or on_b.get("b", ())), ("m", on_a["m"]), ("n", on_b["n"]), ("k", k_axes)]
    chosen = choose_axes(mesh, candidates, sizes)
    out_dtype = np.dtype(out_dtype)
    k_split = chosen["k"]
    partial_dtype = np.dtype(np.float32) if k_split else out_dtype

    def per_shard(a, b):
        call = gemm_call(a.shape, b.shape, a_major, b_major, a.dtype, partial_dtype)
        out = gemm_local_p.bind(
            a, b, a_major=a_major, b_major=b_major, out_dtype=partial_dtype, plan=plans.for_shard(plan, call)
        )
        if k_split:  # fp32 partial products over K, summed across its shards
            out = lax.psum(out, k_split).astype(out_dtype)
        return out

    arg_shardings = (NamedSharding(mesh, spec_of(fa, chosen)), NamedSharding(mesh, spec_of(fb, chosen)))
    return mesh, per_shard, NamedSharding(mesh, spec_of(fo, chosen)), arg_shardings


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
        out = gemm(a.reshape(v * m, k), b, a_major="k", b_major=b_major, out_dtype=out_dtype, device=dev)
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


gemm_p = partitioned_primitive(
    "jax_cluster_gemm",
    static=("a_major", "b_major", "out_dtype", "plan"),
    abstract_eval=_abstract_eval,
    whole=_whole,
    partition=_partition,
    sharding_rule=_sharding_rule,
    batch_rule=_batch_rule,
)


# --------------------------------------------------------------------------- binding


def gemm(a, b, *, a_major="k", b_major="n", out_dtype=None, plan: Plan | None = None, device=None):
    """Binds gemm_p with `plan`, or with a fresh plan when none is given."""
    out_dtype = np.dtype(out_dtype if out_dtype is not None else a.dtype)
    if plan is not None and plan.problem != "dense":
        raise ValueError(f"jax_cluster: a {plan.problem} plan (from plan_ragged) cannot run a dense GEMM")
    call = gemm_call(a.shape, b.shape, a_major, b_major, a.dtype, out_dtype)
    plan = plans.choose(call, plan, device, "jax_cluster")
    return gemm_p.bind(a, b, a_major=a_major, b_major=b_major, out_dtype=out_dtype, plan=plan)


# --------------------------------------------------------------------------- autodiff


def _transpose_a(ct, a, b, *, a_major, b_major, out_dtype, plan):
    ct = ct_as(ct, a)
    dev = plan.device
    if a_major == "k":  # dA[M,K] = dC[M,N] . B^T
        return gemm(ct, b, a_major="k", b_major=FLIP_B[b_major], out_dtype=a.aval.dtype, device=dev)
    # dA[K,M] = B . dC^T
    return gemm(b, ct, a_major="k" if b_major == "n" else "m", b_major="k", out_dtype=a.aval.dtype, device=dev)


def _transpose_b(ct, a, b, *, a_major, b_major, out_dtype, plan):
    ct = ct_as(ct, b)
    dev = plan.device
    if b_major == "n":  # dB[K,N] = A^T . dC
        return gemm(a, ct, a_major="m" if a_major == "k" else "k", b_major="n", out_dtype=b.aval.dtype, device=dev)
    # dB[N,K] = dC^T . A
    return gemm(ct, a, a_major="m", b_major="n" if a_major == "k" else "k", out_dtype=b.aval.dtype, device=dev)


ad.defbilinear(gemm_p, _transpose_a, _transpose_b)
