"""The `out_sharding=` argument the ops share with lax's (nnx passes it):
whether it constrains anything, and the op's output placed in it."""

from __future__ import annotations

import jax
from jax.sharding import PartitionSpec


def explicit_mesh(lhs, rhs, out_sharding) -> bool:
    """Whether sharding is part of the operands' types (AxisType.Explicit): the
    kernel's primitive has no sharding rule for types, lax.dot_general has."""
    if out_sharding is None:
        return False
    meshes = [jax.sharding.get_abstract_mesh()]
    meshes += [getattr(jax.typeof(x).sharding, "mesh", None) for x in (lhs, rhs)]
    return any(_has_explicit_axes(m) for m in meshes)


def _has_explicit_axes(mesh) -> bool:
    return mesh is not None and not mesh.empty and jax.sharding.AxisType.Explicit in mesh.axis_types


def place(out, out_sharding):
    """The kernel's output in the asked sharding: reshard onto a mesh with
    explicit axes (with_sharding_constraint refuses those), else a constraint."""
    if _has_explicit_axes(getattr(out_sharding, "mesh", None)):
        return jax.sharding.reshard(out, out_sharding)
    return jax.lax.with_sharding_constraint(out, out_sharding)


def constrains(out_sharding, who: str) -> bool:
    """False for None and for a spec that splits nothing outside any mesh,
    which asks for nothing a constraint could say."""
    if out_sharding is None:
        return False
    if isinstance(out_sharding, PartitionSpec) and jax.sharding.get_abstract_mesh().empty:
        if all(entry is None for entry in out_sharding):
            return False
        raise ValueError(
            f"{who}: out_sharding={out_sharding} names mesh axes "
            "but no mesh is set; pass a NamedSharding or use jax.set_mesh"
        )
    return True
