"""How every primitive of the package is put together, in one place.

An op has two primitives. The outer one carries the rules users see (shape
and dtype checks, autodiff, vmap) and lowers through custom_partitioning, so
a sharded call runs one planned kernel per shard. The local one is what each
shard binds: the FFI call of its plan on CUDA, XLA's own ops elsewhere.
"""

from __future__ import annotations

import functools

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir
from jax.sharding import NamedSharding, PartitionSpec


def partitioned_primitive(
    name: str,
    *,
    static: tuple[str, ...],
    abstract_eval,
    whole,
    partition,
    sharding_rule,
    batch_rule=None,
    multiple_results=False,
) -> Primitive:
    """The outer primitive of an op.

    `static` names its parameters, in the order `whole(*operands, *static)`,
    `partition(*static, mesh, arg_shapes, result_shape)` and
    `sharding_rule(*static, mesh, operand_types, result_types)` take them.
    `batch_rule="loop"` maps the primitive over a vmapped axis with lax.map.
    With `multiple_results`, `whole` and the partitioned function return a
    tuple, and `partition` gives one sharding per result.
    """
    primitive = Primitive(name)
    primitive.multiple_results = multiple_results
    primitive.def_impl(
        functools.partial(jax.jit, static_argnames=static)(lambda *args, **params: primitive.bind(*args, **params))
    )
    primitive.def_abstract_eval(abstract_eval)
    sharded = None

    def lowering(ctx, *args, **params):
        nonlocal sharded
        if sharded is None:  # the static arguments follow the operands
            sharded = custom_partitioning(whole, static_argnums=tuple(range(len(args), len(args) + len(static))))
            sharded.def_partition(
                partition=functools.partial(_with_mesh_shardings, partition),
                sharding_rule=sharding_rule,
                decode_shardings=False,
            )
        values = tuple(params[p] for p in static)
        return mlir.lower_fun(lambda *xs: sharded(*xs, *values), multiple_results=multiple_results)(ctx, *args)

    mlir.register_lowering(primitive, lowering)
    _needs_devices_at_lowering(primitive)
    _set_batch_rule(primitive, batch_rule)
    return primitive


def _with_mesh_shardings(partition, *args):
    """`partition` with its operands' and results' shardings as mesh axes.
    JAX's own decoding fails on a sharding that splits a mesh axis into
    sub-axes (the propagation makes them, e.g. through a reshape of a
    dimension split finer than its inner size); such an operand is taken as
    replicated here, and the rule asks for the sharding it wants."""
    *static, mesh, arg_shapes, result_shape = args
    decoded = [_on_mesh(mesh, a) for a in arg_shapes]
    results = jax.tree.map(lambda r: _on_mesh(mesh, r), result_shape)
    return partition(*static, mesh, decoded, results)


def _on_mesh(mesh, arg):
    from jax._src import sharding_impls  # the decoding custom_partitioning itself uses

    spec = PartitionSpec()
    if arg.sharding is not None:
        try:
            spec = sharding_impls.parse_flatten_op_sharding(arg.sharding._to_xla_hlo_sharding(len(arg.shape)), mesh)[0]
        except (KeyError, ValueError, AssertionError, StopIteration):
            spec = PartitionSpec()  # sub-axes: replicated
    spec = PartitionSpec(*spec, *((None,) * (len(arg.shape) - len(spec))))
    return jax.ShapeDtypeStruct(arg.shape, arg.dtype, sharding=NamedSharding(mesh, spec))


def _set_batch_rule(primitive: Primitive, batch_rule) -> None:
    if batch_rule == "loop":
        batch_rule = functools.partial(_loop_batch_rule, primitive)
    if batch_rule is not None:
        batching.primitive_batchers[primitive] = batch_rule


def _loop_batch_rule(primitive, args, dims, **params):
    """One bind per element of the vmapped axis (lax.map), for kernels with
    no batch of their own: the grouped ones, where folding the batch into
    the groups would copy rhs."""
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    moved = [None if d is None else batching.bdim_at_front(x, d, size) for x, d in zip(args, dims)]

    def one(batched):
        it = iter(batched)
        return primitive.bind(*[x if m is None else next(it) for x, m in zip(args, moved)], **params)

    out = jax.lax.map(one, [m for m in moved if m is not None])
    return out, ([0] * len(out) if primitive.multiple_results else 0)


def local_primitive(
    name: str, *, abstract_eval, xla_impl, cuda_lowering, cpu_impl=None, multiple_results=False, batch_rule=None
) -> Primitive:
    """The one-device primitive of an op: `cuda_lowering` on CUDA, `cpu_impl`
    on the CPU where given, `xla_impl` (jnp code with the same parameters)
    everywhere else. `batch_rule`, as for partitioned_primitive ("loop": one
    bind per element of the vmapped axis)."""
    primitive = Primitive(name)
    primitive.multiple_results = multiple_results
    # outside jit (eager calls) a bind compiles the one call
    primitive.def_impl(lambda *args, **params: jax.jit(functools.partial(primitive.bind, **params))(*args))
    primitive.def_abstract_eval(abstract_eval)
    mlir.register_lowering(primitive, mlir.lower_fun(xla_impl, multiple_results=multiple_results))
    if cpu_impl is not None:
        mlir.register_lowering(primitive, mlir.lower_fun(cpu_impl, multiple_results=multiple_results), platform="cpu")
    mlir.register_lowering(primitive, cuda_lowering, platform="cuda")
    _set_batch_rule(primitive, batch_rule)
    return primitive


def _needs_devices_at_lowering(primitive: Primitive) -> None:
    """custom_partitioning's lowering needs the device assignment, which jit
    hands only to primitives in this set. JAX has no public API for it; its
    own cuDNN wrappers register the same way."""
    from jax._src import dispatch

    dispatch.prim_requires_devices_during_lowering.add(primitive)
