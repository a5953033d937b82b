"""ragged_dot_p: shape rules, autodiff, batching and partitioning of the grouped GEMM.

Two problems (see planning/grouped.py for their GEMM views), both with rows
[0, M) of the operands split into G consecutive groups by group_sizes:
  "ragged_m": lhs [M,K] times rhs[g], rhs [G,K,N] (b_major "n") or [G,N,K]
              (b_major "k", read in place) -> out [M,N].
  "ragged_k": lhs [M,K'] and rhs [M,N'] -> out [G,K',N'], out[g] = lhs_g^T rhs_g.
Group sizes follow one rule on every path: a negative size counts as 0 and
groups are cut at M (`lowering.clamp_group_sizes`). Rows past the last group are zero.

Group sizes [S,G] make the rows S equal blocks, each its own problem with
sizes[s] (ragged_k sums the blocks). Sharding S (and the rows with it) gives
each device whole blocks with their own sizes: data parallelism. Over a mesh:
  ragged_m: rows split -> local grouped GEMMs, output rows split alike; N split
    on rhs -> output columns split; K split on both -> partials, a psum.
  ragged_k: K' and N' split -> output split alike; rows split -> partials,
    then a psum.
Partials are added in fp32: written in fp32 where a kernel does, else in the
output dtype (the grouped kernels write their input dtype only), so the sum
never leaves the kernels for XLA's path (plans.for_partials). Each shard is
planned for its own local problem (one row block).
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax import lax
from jax.interpreters import ad
from jax.sharding import NamedSharding

from jax_cluster.planning.call import Call
from jax_cluster.planning.grouped import DEFAULT_A_MAJOR, RAGGED_PROBLEMS
from jax_cluster.planning.plan import Plan, dtype_name
from jax_cluster.primitives import plans
from jax_cluster.primitives.lowering import ragged_local_p
from jax_cluster.primitives.operands import FLIP_B, check_dtypes, ct_as, gemm_view
from jax_cluster.primitives.registry import partitioned_primitive
from jax_cluster.primitives.specs import choose_axes, dim_axes, rule_options, spec_of, term

_WHO = "jax_cluster.ragged_dot"
_LAYOUT_NAME = {"n": "gkn", "k": "gnk"}


def _check(a, b, group_sizes, problem, b_major, out_dtype):
    """Output shape, or a clear error; runs before planning and at abstract eval."""
    if problem not in RAGGED_PROBLEMS:
        raise ValueError(f"{_WHO}: problem must be one of {RAGGED_PROBLEMS}, got {problem!r}")
    if b_major not in ("n", "k") or (problem == "ragged_k" and b_major != "n"):
        raise ValueError(f"{_WHO}: b_major {b_major!r} is not supported for {problem}")
    if group_sizes.ndim not in (1, 2):
        raise ValueError(f"{_WHO}: group_sizes must be [G] or [S,G] (S row blocks), got shape {group_sizes.shape}")
    if group_sizes.dtype != np.dtype(np.int32):
        raise TypeError(f"{_WHO}: group_sizes must be int32, got {group_sizes.dtype}")
    check_dtypes(_WHO, out_dtype, lhs=a, rhs=b)
    groups = group_sizes.shape[-1]
    blocks = group_sizes.shape[0] if group_sizes.ndim == 2 else 1
    if a.ndim >= 1 and (blocks == 0 or a.shape[0] % blocks):
        raise ValueError(
            f"{_WHO}: group_sizes {group_sizes.shape} splits the {a.shape[0]} rows into {blocks} blocks; "
            "the rows must be a positive multiple of it"
        )
    if problem == "ragged_k":
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[0]:
            raise ValueError(
                f"{_WHO}: ragged_k takes lhs [M,K'] and rhs [M,N'] with the same M, got {a.shape} and {b.shape}"
            )
        return groups, a.shape[1], b.shape[1]
    layout = _LAYOUT_NAME[b_major]
    if a.ndim != 2 or b.ndim != 3:
        raise ValueError(f"{_WHO}: lhs must be [M,K] and rhs [G,K,N] or [G,N,K], got shapes {a.shape} and {b.shape}")
    if b.shape[0] != groups:
        raise ValueError(f"{_WHO}: rhs {b.shape} has {b.shape[0]} groups but group_sizes has {groups}")
    kb, n = (b.shape[1], b.shape[2]) if b_major == "n" else (b.shape[2], b.shape[1])
    if a.shape[1] != kb:
        raise ValueError(
            f"{_WHO}: contracting dimensions differ: lhs {a.shape} has K={a.shape[1]}, "
            f"rhs {b.shape} ({layout}) has K={kb}"
        )
    return a.shape[0], n


def ragged_call(a_shape, b_shape, sizes_shape, problem, b_major, dtype, out_dtype) -> Call:
    """The Call of one row block of a grouped GEMM on operands of these shapes."""
    blocks = sizes_shape[0] if len(sizes_shape) == 2 else 1
    m, n, k = gemm_view(a_shape, b_shape, problem, b_major, blocks)
    return Call(
        problem, m, n, k, sizes_shape[-1], DEFAULT_A_MAJOR[problem], b_major, dtype_name(dtype), dtype_name(out_dtype)
    )


def _abstract_eval(a, b, group_sizes, *, problem, b_major, out_dtype, plan):
    return jax.core.ShapedArray(_check(a, b, group_sizes, problem, b_major, out_dtype), out_dtype)


# --------------------------------------------------------------------------- partitioning


def _shard_plan(plan, a, b, group_sizes, problem, b_major, out_dtype) -> Plan:
    call = ragged_call(a.shape, b.shape, group_sizes.shape, problem, b_major, a.dtype, out_dtype)
    return plans.for_shard(plan, call)


def _blockwise(a, b, group_sizes, problem, b_major, out_dtype, plan):
    """One grouped call per row block; ragged_k adds the blocks' partials in fp32."""
    out_dtype = np.dtype(out_dtype)
    if group_sizes.ndim == 1:
        return ragged_local_p.bind(a, b, group_sizes, problem=problem, b_major=b_major, out_dtype=out_dtype, plan=plan)
    blocks = group_sizes.shape[0]
    rows = a.shape[0] // blocks
    if problem == "ragged_m":
        outs = [
            ragged_local_p.bind(
                a[s * rows : (s + 1) * rows],
                b,
                group_sizes[s],
                problem=problem,
                b_major=b_major,
                out_dtype=out_dtype,
                plan=plan,
            )
            for s in range(blocks)
        ]
        return lax.concatenate(outs, 0) if blocks > 1 else outs[0]
    if blocks == 1:
        p, partial_dtype = plan, out_dtype
    else:
        p, partial_dtype = plans.for_partials(
            plan, lambda d: ragged_call(a.shape, b.shape, group_sizes.shape, problem, b_major, a.dtype, d), out_dtype
        )
    total = None
    for s in range(blocks):
        part = ragged_local_p.bind(
            a[s * rows : (s + 1) * rows],
            b[s * rows : (s + 1) * rows],
            group_sizes[s],
            problem=problem,
            b_major=b_major,
            out_dtype=partial_dtype,
            plan=p,
        ).astype(np.float32)
        total = part if total is None else total + part
    return total.astype(out_dtype)


def _factors(problem, b_major, blocked):
    """Factor names of lhs, rhs, group_sizes and the output; "s" is the row
    block (S), "r" a row within a block, "m" the rows of a single block."""
    rows = "s" if blocked else "m"
    sizes = ("s", "g") if blocked else ("g",)
    if problem == "ragged_k":
        return (rows, "i"), (rows, "j"), sizes, ("g", "i", "j")
    rhs = ("g", "k", "n") if b_major == "n" else ("g", "n", "k")
    return (rows, "k"), rhs, sizes, (rows, "n")


def _sharding_rule(problem, b_major, out_dtype, plan, mesh, operand_types, result_types):
    a_shape, _, sizes_shape = (tuple(t.shape) for t in operand_types)
    blocked = len(sizes_shape) == 2
    fa, fb, fs, fo = _factors(problem, b_major, blocked)
    # the rows of lhs, rhs (ragged_k) and output (ragged_m) are S blocks of R rows
    rows, size_of = term(("s", sizes_shape[0]), ("r", a_shape[0] // sizes_shape[0])) if blocked else ("m", {})

    def dims(names):
        return " ".join(rows if f in ("s", "m") else f for f in names)

    rule = f"{dims(fa)}, {dims(fb)}, {' '.join(fs)} -> {dims(fo)}"
    # a block is never split: its groups are one sorted run
    reduced = ("s",) if problem == "ragged_k" else ("k",)
    return rule, rule_options(rule, reduction=reduced, replication=("r", "m"), sizes=size_of)


def _partition(problem, b_major, out_dtype, plan, mesh, arg_shapes, result_shape):
    a, b, sizes = arg_shapes
    blocked = len(sizes.shape) == 2
    fa, fb, fs, fo = _factors(problem, b_major, blocked)
    on_a, on_b = dict(zip(fa, dim_axes(a))), dict(zip(fb, dim_axes(b)))
    extents = {**dict(zip(fb, b.shape)), **dict(zip(fa, a.shape)), **dict(zip(fs, sizes.shape))}
    blocks = (dim_axes(sizes)[0] or on_a["s"]) if blocked else ()
    if problem == "ragged_k":
        candidates = [("s", blocks), ("i", on_a["i"]), ("j", on_b["j"])]
        summed = "s"
    else:
        k_axes = on_a["k"] if on_a["k"] == on_b["k"] else ()
        candidates = [("s", blocks), ("n", on_b["n"]), ("k", k_axes)]
        summed = "k"
    chosen = choose_axes(mesh, candidates, extents)
    out_dtype = np.dtype(out_dtype)
    split_sum = chosen[summed]

    def per_shard(a, b, group_sizes):
        if not split_sum:
            p = _shard_plan(plan, a, b, group_sizes, problem, b_major, out_dtype)
            return _blockwise(a, b, group_sizes, problem, b_major, out_dtype, p)
        p, partial_dtype = plans.for_partials(
            plan, lambda d: ragged_call(a.shape, b.shape, group_sizes.shape, problem, b_major, a.dtype, d), out_dtype
        )
        out = _blockwise(a, b, group_sizes, problem, b_major, partial_dtype, p).astype(np.float32)
        return lax.psum(out, split_sum).astype(out_dtype)  # the shards' partials added in float32

    shardings = tuple(NamedSharding(mesh, spec_of(f, chosen)) for f in (fa, fb, fs))
    return mesh, per_shard, NamedSharding(mesh, spec_of(fo, chosen)), shardings


# --------------------------------------------------------------------------- batching


ragged_dot_p = partitioned_primitive(
    "jax_cluster_ragged_dot",
    static=("problem", "b_major", "out_dtype", "plan"),
    abstract_eval=_abstract_eval,
    whole=_blockwise,
    partition=_partition,
    sharding_rule=_sharding_rule,
    batch_rule="loop",
)


# --------------------------------------------------------------------------- binding


def ragged(a, b, group_sizes, *, problem, b_major="n", out_dtype=None, plan: Plan | None = None, device=None):
    """Binds ragged_dot_p with `plan`, or with a fresh plan when none is given."""
    out_dtype = np.dtype(out_dtype if out_dtype is not None else a.dtype)
    _check(a, b, group_sizes, problem, b_major, out_dtype)
    call = ragged_call(a.shape, b.shape, group_sizes.shape, problem, b_major, a.dtype, out_dtype)
    plan = plans.choose(call, plan, device, _WHO)
    return ragged_dot_p.bind(a, b, group_sizes, problem=problem, b_major=b_major, out_dtype=out_dtype, plan=plan)


# --------------------------------------------------------------------------- autodiff
# Linear in lhs and in rhs. Every product below reads its operands in place:
# a transposed operand is a flipped major, never a copy.


def _jvp_lhs(t, a, b, group_sizes, **params):
    return ragged_dot_p.bind(t, b, group_sizes, **params)


def _jvp_rhs(t, a, b, group_sizes, **params):
    return ragged_dot_p.bind(a, t, group_sizes, **params)


ad.defjvp(ragged_dot_p, _jvp_lhs, _jvp_rhs, None)


def _transpose(ct, a, b, group_sizes, *, problem, b_major, out_dtype, plan):
    if ad.is_undefined_primal(group_sizes) or ad.is_undefined_primal(a) == ad.is_undefined_primal(b):
        raise TypeError(f"{_WHO}: linear in lhs or rhs alone, never in group_sizes or both at once")
    if type(ct) is ad.Zero:
        return [None, None, None]
    go = functools.partial(ragged, device=plan.device)
    if ad.is_undefined_primal(a):
        ct = ct_as(ct, a)
        if problem == "ragged_m":  # d_lhs[rows g] = ct[rows g] . B[g]^T
            da = go(ct, b, group_sizes, problem="ragged_m", b_major=FLIP_B[b_major], out_dtype=a.aval.dtype)
        else:  # d_a[rows g] = b[rows g] . ct[g]^T, ct [G,K',N'] k-major
            da = go(b, ct, group_sizes, problem="ragged_m", b_major="k", out_dtype=a.aval.dtype)
        return [da, None, None]
    ct = ct_as(ct, b)
    if problem == "ragged_k":  # d_b[rows g] = a[rows g] . ct[g]
        db = go(a, ct, group_sizes, problem="ragged_m", b_major="n", out_dtype=b.aval.dtype)
    elif b_major == "n":  # d_rhs[g] [K,N] = lhs_g^T . ct_g
        db = go(a, ct, group_sizes, problem="ragged_k", out_dtype=b.aval.dtype)
    else:  # d_rhs[g] [N,K] = ct_g^T . lhs_g: already [G,N,K]
        db = go(ct, a, group_sizes, problem="ragged_k", out_dtype=b.aval.dtype)
    return [None, db, None]


ad.primitive_transposes[ragged_dot_p] = _transpose
