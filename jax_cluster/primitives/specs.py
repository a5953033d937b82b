"""PartitionSpec arithmetic shared by the partition rules of the GEMM primitives."""

from __future__ import annotations

import math
import re

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


def term(*parts: tuple[str, int]) -> tuple[str, dict[str, int]]:
    """One dimension of a sharding rule made of factors (name, size), major
    first: "(a b)" with the factors' sizes, or a plain factor. Factors of size
    1 are left out (Shardy refuses them inside a compound); a dimension of
    size 1 is its first factor."""
    kept = [(name, size) for name, size in parts if size != 1]
    if len(kept) < 2:
        return (kept or parts)[0][0], {}
    return "(" + " ".join(name for name, _ in kept) + ")", dict(kept)


def tied(name: str, size: int, tile: int):
    """(values' term, scale factor, factor sizes, factors needing
    replication) of a sharding rule for a dimension of `size` values with
    one scale per `tile`: the compound "(nameb namet)" and "nameb", so the
    propagation splits values and scales alike, where whole tiles make up
    the dimension; else the plain factor `name` and a scale factor "nameb"
    kept replicated at the op (scales are small)."""
    block = f"{name}b"
    if size % tile == 0:
        values, sizes = term((block, size // tile), (f"{name}t", tile))
        return values, block, sizes, ()
    return name, block, {}, (block,)


def rule_options(rule: str, *, reduction=(), replication=(), sizes=None) -> dict:
    """A sharding rule's options, keeping only the factors `rule` names (a
    size-1 factor left out of a compound by `term` must not be listed) and
    the sizes only of factors that appear in compounds alone (JAX infers,
    and refuses, those of whole dimensions)."""
    inner = re.findall(r"\(([^)]*)\)", rule)
    compound = {f for group in inner for f in group.split()}
    whole = set(re.sub(r"\([^)]*\)", " ", rule).replace(",", " ").replace("->", " ").split())
    # factors in order of first appearance: the order the rule's factor indices take
    order = list(dict.fromkeys(re.sub(r"[(),]|->", " ", rule).split()))
    options = {k: v for k, v in (sizes or {}).items() if k in compound and k not in whole}
    options["reduction_factors"] = tuple(f for f in order if f in reduction)
    options["need_replication_factors"] = tuple(f for f in order if f in replication)
    return options
