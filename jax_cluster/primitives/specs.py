"""PartitionSpec arithmetic shared by the partition rules of the GEMM primitives."""

from __future__ import annotations

import math

from jax.sharding import PartitionSpec


def mesh_axes(entry) -> tuple[str, ...]:
    """A PartitionSpec entry (None, a name, or a tuple of names) as a tuple."""
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def dim_axes(arg) -> list[tuple[str, ...]]:
    """The mesh axes each dimension of a partition-callback argument is split on."""
    spec = tuple(getattr(arg.sharding, "spec", ()))
    spec = spec + (None,) * (len(arg.shape) - len(spec))
    return [mesh_axes(e) for e in spec]


def shards(mesh, axes) -> int:
    return math.prod(mesh.shape[a] for a in axes)


def spec_of(names, chosen) -> PartitionSpec:
    """The PartitionSpec of an array whose dims are the factors `names`."""
    entries = []
    for f in names:
        axes = chosen.get(f, ())
        entries.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*entries)


def choose_axes(mesh, candidates, sizes) -> dict[str, tuple[str, ...]]:
    """Mesh axes per factor, in the order given: a factor keeps its axes when
    they divide its size evenly (padding would put garbage in a K sum) and no
    earlier factor has taken one of them; otherwise it is replicated."""
    chosen, used = {}, set()
    for factor, axes in candidates:
        ok = axes and not (used & set(axes)) and sizes[factor] % shards(mesh, axes) == 0
        chosen[factor] = axes if ok else ()
        used |= set(chosen[factor])
    return chosen


def tied(name: str, size: int, tile: int):
    """(values' factor, scale factor, factor sizes, factors needing
    replication) of a sharding rule for a dimension of `size` values with
    one scale per `tile`: the compound "(nameb namet)" and "nameb", so the
    propagation splits values and scales alike, where whole tiles make up
    the dimension; else the plain factor `name` and a scale factor "nameb"
    kept replicated at the op (scales are small)."""
    block = f"{name}b"
    if size % tile == 0:
        return f"({block} {name}t)", block, {f"{name}t": tile}, ()
    return name, block, {}, (block,)
