"""How gemm_epilogue_p splits over a mesh (custom_partitioning, Shardy rule).

Factors: A "m k", B "k n" (or "n k"), bias "n", C "m n" -> out "m n".
  M or N sharded -> one fused kernel per shard, with its slice of bias and C;
  K sharded      -> fp32 partial products, a psum, then the epilogue on XLA
                    (act(alpha*z + beta*C + bias) needs the whole sum first).
Each shard is planned for its own local shape. Absent bias or C are empty
placeholders with a factor of their own that is never split.
"""
from __future__ import annotations

import numpy as np
from jax import lax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding

from jax_cluster.local_primitives import apply_epilogue, epilogue_local_p, gemm_local_p
from jax_cluster.partition_gemm import local_plan
from jax_cluster.partition_specs import choose_axes, dim_axes, spec_of


def _factors(b_major, has_bias, has_c):
    b = ("k", "n") if b_major == "n" else ("n", "k")
    return ("m", "k"), b, ("n",) if has_bias else ("bias_absent",), \
        ("m", "n") if has_c else ("c_absent",), ("m", "n")


def _whole(a, b, bias, c, b_major, out_dtype, alpha, beta, activation, plan):
    return epilogue_local_p.bind(a, b, bias, c, b_major=b_major, out_dtype=out_dtype,
                                 alpha=alpha, beta=beta, activation=activation, plan=plan)


sharded_epilogue = custom_partitioning(_whole, static_argnums=(4, 5, 6, 7, 8, 9))


def _sharding_rule(b_major, out_dtype, alpha, beta, activation, plan, mesh, operand_types,
                   result_types):
    names = _factors(b_major, operand_types[2].shape[0] > 0, operand_types[3].shape[0] > 0)
    ins = ", ".join(" ".join(f) for f in names[:4])
    return f"{ins} -> {' '.join(names[4])}", {"reduction_factors": ("k",)}


def _partition(b_major, out_dtype, alpha, beta, activation, plan, mesh, arg_shapes, result_shape):
    a, b, bias, c = arg_shapes
    has_bias, has_c = bias.shape[0] > 0, c.shape[0] > 0
    fa, fb, fbias, fc, fo = _factors(b_major, has_bias, has_c)
    on_a, on_b = dict(zip(fa, dim_axes(a))), dict(zip(fb, dim_axes(b)))
    sizes = {**dict(zip(fb, b.shape)), **dict(zip(fa, a.shape))}
    k_axes = on_a["k"] if on_a["k"] == on_b["k"] else ()
    chosen = choose_axes(mesh, [("m", on_a["m"]), ("n", on_b["n"]), ("k", k_axes)], sizes)
    out_dtype = np.dtype(out_dtype)
    k_split = chosen["k"]

    def per_shard(a, b, bias, c):
        if not k_split:
            p = local_plan(plan, a, b, "k", b_major, out_dtype, "bias_act")
            return epilogue_local_p.bind(a, b, bias, c, b_major=b_major, out_dtype=out_dtype,
                                         alpha=alpha, beta=beta, activation=activation, plan=p)
        f32 = np.dtype(np.float32)
        p = local_plan(plan, a, b, "k", b_major, f32)
        z = lax.psum(gemm_local_p.bind(a, b, a_major="k", b_major=b_major, out_dtype=f32, plan=p),
                     k_split)
        return apply_epilogue(z, bias, c, alpha=alpha, beta=beta, activation=activation,
                              out_dtype=out_dtype)

    arg_shardings = tuple(NamedSharding(mesh, spec_of(f, chosen)) for f in (fa, fb, fbias, fc))
    return mesh, per_shard, NamedSharding(mesh, spec_of(fo, chosen)), arg_shardings


sharded_epilogue.def_partition(partition=_partition, sharding_rule=_sharding_rule)
