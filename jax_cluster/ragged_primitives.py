"""ragged_dot_p: shape rules, autodiff, batching and lowering of the grouped GEMM.

Two problems (see ragged_plan.py for their GEMM views), both with rows
[0, M) of the operands split into G consecutive groups by group_sizes:
  "ragged_m": lhs [M,K] times rhs[g], rhs [G,K,N] (b_major "n") or [G,N,K]
              (b_major "k", read in place) -> out [M,N].
  "ragged_k": lhs [M,K'] and rhs [M,N'] -> out [G,K',N'], out[g] = lhs_g^T rhs_g.
Group sizes follow one rule on every path: a negative size counts as 0 and
groups are cut at M (`local_primitives.clamp_group_sizes`). Rows past the last group are zero.
Group sizes [S,G] make the rows S equal blocks, each its own problem with
sizes[s] (ragged_k sums the blocks): the per-shard sizes of token-sharded
data parallelism (partition_ragged.py).
"""
from __future__ import annotations

import functools

import jax
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from jax_cluster.local_primitives import gemm_view
from jax_cluster.partition_ragged import sharded_ragged
from jax_cluster.partition_specs import lowers_through_custom_partitioning
from jax_cluster.plan import Plan, dtype_name
from jax_cluster.primitives import _FLIP_B, _ct_as, check_dtypes
from jax_cluster.ragged_plan import DEFAULT_A_MAJOR, RAGGED_PROBLEMS, plan_ragged

ragged_dot_p = Primitive("jax_cluster_ragged_dot")
_WHO = "jax_cluster.ragged_dot"
_LAYOUT_NAME = {"n": "gkn", "k": "gnk"}


def _check(a, b, group_sizes, problem, b_major, out_dtype):
    """Output shape, or a clear error; runs before planning and at abstract eval."""
    if problem not in RAGGED_PROBLEMS:
        raise ValueError(f"{_WHO}: problem must be one of {RAGGED_PROBLEMS}, got {problem!r}")
    if b_major not in ("n", "k") or (problem == "ragged_k" and b_major != "n"):
        raise ValueError(f"{_WHO}: b_major {b_major!r} is not supported for {problem}")
    if group_sizes.ndim not in (1, 2):
        raise ValueError(f"{_WHO}: group_sizes must be [G] or [S,G] (S row blocks), got shape "
                         f"{group_sizes.shape}")
    if group_sizes.dtype != np.dtype(np.int32):
        raise TypeError(f"{_WHO}: group_sizes must be int32, got {group_sizes.dtype}")
    check_dtypes(_WHO, out_dtype, lhs=a, rhs=b)
    groups = group_sizes.shape[-1]
    blocks = group_sizes.shape[0] if group_sizes.ndim == 2 else 1
    if a.ndim >= 1 and (blocks == 0 or a.shape[0] % blocks):
        raise ValueError(f"{_WHO}: group_sizes {group_sizes.shape} splits the {a.shape[0]} rows "
                         f"into {blocks} blocks; the rows must be a positive multiple of it")
    if problem == "ragged_k":
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[0]:
            raise ValueError(f"{_WHO}: ragged_k takes lhs [M,K'] and rhs [M,N'] with the same M, "
                             f"got {a.shape} and {b.shape}")
        return groups, a.shape[1], b.shape[1]
    layout = _LAYOUT_NAME[b_major]
    if a.ndim != 2 or b.ndim != 3:
        raise ValueError(f"{_WHO}: lhs must be [M,K] and rhs [G,K,N] or [G,N,K], got shapes "
                         f"{a.shape} and {b.shape}")
    if b.shape[0] != groups:
        raise ValueError(f"{_WHO}: rhs {b.shape} has {b.shape[0]} groups but group_sizes has "
                         f"{groups}")
    kb, n = (b.shape[1], b.shape[2]) if b_major == "n" else (b.shape[2], b.shape[1])
    if a.shape[1] != kb:
        raise ValueError(f"{_WHO}: contracting dimensions differ: lhs {a.shape} has "
                         f"K={a.shape[1]}, rhs {b.shape} ({layout}) has K={kb}")
    return a.shape[0], n


def _abstract_eval(a, b, group_sizes, *, problem, b_major, out_dtype, plan):
    shape = _check(a, b, group_sizes, problem, b_major, out_dtype)
    return jax.core.ShapedArray(shape, out_dtype)


def _lowering(ctx, a, b, group_sizes, *, problem, b_major, out_dtype, plan):
    """Through custom_partitioning, so token-sharded calls run per shard."""
    return mlir.lower_fun(
        lambda a, b, sizes: sharded_ragged(a, b, sizes, problem, b_major, np.dtype(out_dtype),
                                           plan),
        multiple_results=False)(ctx, a, b, group_sizes)


ragged_dot_p.def_impl(functools.partial(jax.jit, static_argnames=("problem", "b_major",
                                                                  "out_dtype", "plan"))(
    lambda a, b, group_sizes, **params: ragged_dot_p.bind(a, b, group_sizes, **params)))
ragged_dot_p.def_abstract_eval(_abstract_eval)
mlir.register_lowering(ragged_dot_p, _lowering)
lowers_through_custom_partitioning(ragged_dot_p)


# --------------------------------------------------------------------------- binding


def ragged(a, b, group_sizes, *, problem, b_major="n", out_dtype=None, plan: Plan | None = None,
           device=None):
    """Binds ragged_dot_p, planning the call if no plan is given."""
    out_dtype = np.dtype(out_dtype if out_dtype is not None else a.dtype)
    _check(a, b, group_sizes, problem, b_major, out_dtype)
    blocks = group_sizes.shape[0] if group_sizes.ndim == 2 else 1
    m, n, k = gemm_view(a.shape, b.shape, problem, b_major, blocks)
    groups = group_sizes.shape[-1]
    a_major = DEFAULT_A_MAJOR[problem]
    call = (problem, m, n, k, groups, a_major, b_major, dtype_name(a.dtype), dtype_name(out_dtype))
    if plan is None:
        plan = plan_ragged(m, n, k, groups, problem=problem, dtype=a.dtype, out_dtype=out_dtype,
                           b_major=b_major, a_major=a_major, device=device)
    else:
        made = (plan.problem, plan.m, plan.n, plan.k, plan.groups, plan.a_major, plan.b_major,
                plan.dtype, plan.out_dtype)
        if made != call:
            raise ValueError(f"{_WHO}: the plan was made for {_describe(made)}, but this call is "
                             f"{_describe(call)}")
    return ragged_dot_p.bind(a, b, group_sizes, problem=problem, b_major=b_major,
                             out_dtype=out_dtype, plan=plan)


def _describe(key) -> str:
    problem, m, n, k, groups, a_major, b_major, dtype, out = key
    return (f"{problem} M={m} N={n} K={k} G={groups} A {a_major}-major B {b_major}-major "
            f"{dtype}->{out}")


# --------------------------------------------------------------------------- autodiff
# Linear in lhs and in rhs. Every product below reads its operands in place:
# a transposed operand is a flipped major, never a copy.


def _jvp_lhs(t, a, b, group_sizes, **params):
    return ragged_dot_p.bind(t, b, group_sizes, **params)


def _jvp_rhs(t, a, b, group_sizes, **params):
    return ragged_dot_p.bind(a, t, group_sizes, **params)


ad.defjvp(ragged_dot_p, _jvp_lhs, _jvp_rhs, None)


def _transpose(ct, a, b, group_sizes, *, problem, b_major, out_dtype, plan):
    assert not ad.is_undefined_primal(group_sizes)
    assert ad.is_undefined_primal(a) != ad.is_undefined_primal(b), "not linear in both at once"
    if type(ct) is ad.Zero:
        return [None, None, None]
    go = functools.partial(ragged, device=plan.device)
    if ad.is_undefined_primal(a):
        ct = _ct_as(ct, a)
        if problem == "ragged_m":    # d_lhs[rows g] = ct[rows g] . B[g]^T
            da = go(ct, b, group_sizes, problem="ragged_m", b_major=_FLIP_B[b_major],
                    out_dtype=a.aval.dtype)
        else:                        # d_a[rows g] = b[rows g] . ct[g]^T, ct [G,K',N'] k-major
            da = go(b, ct, group_sizes, problem="ragged_m", b_major="k", out_dtype=a.aval.dtype)
        return [da, None, None]
    ct = _ct_as(ct, b)
    if problem == "ragged_k":        # d_b[rows g] = a[rows g] . ct[g]
        db = go(a, ct, group_sizes, problem="ragged_m", b_major="n", out_dtype=b.aval.dtype)
    elif b_major == "n":             # d_rhs[g] [K,N] = lhs_g^T . ct_g
        db = go(a, ct, group_sizes, problem="ragged_k", out_dtype=b.aval.dtype)
    else:                            # d_rhs[g] [N,K] = ct_g^T . lhs_g: already [G,N,K]
        db = go(ct, a, group_sizes, problem="ragged_k", out_dtype=b.aval.dtype)
    return [None, db, None]


ad.primitive_transposes[ragged_dot_p] = _transpose


# --------------------------------------------------------------------------- batching


def _batch_rule(args, dims, **params):
    """A loop (lax.map) over the vmapped axis: the kernel has no batch of
    ragged problems, and folding the batch into the groups would copy rhs."""
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    moved = [None if d is None else batching.bdim_at_front(x, d, size)
             for x, d in zip(args, dims)]

    def one(batched):
        it = iter(batched)
        operands = [x if m is None else next(it) for x, m in zip(args, moved)]
        return ragged_dot_p.bind(*operands, **params)

    return lax.map(one, [m for m in moved if m is not None]), 0


batching.primitive_batchers[ragged_dot_p] = _batch_rule
