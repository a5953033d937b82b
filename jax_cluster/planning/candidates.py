"""What the dense and grouped planners share: the checks before the menu,
the compiled rows that may take a call, the candidate loop, and the Plan
built from the winning row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from jax_cluster import _ffi
from jax_cluster.planning import tables
from jax_cluster.planning.call import Call
from jax_cluster.planning.device import DeviceInfo
from jax_cluster.planning.plan import Plan


def _alignment_problem(call: Call) -> str:
    lead_a = ("K", call.k) if call.a_major == "k" else ("M", call.m)
    lead_b = ("K", call.k) if call.b_major == "k" else ("N", call.n)
    in_bytes = tables.DTYPE_BYTES[call.dtype]
    out_bytes = tables.DTYPE_BYTES[call.out_dtype]
    for label, (dim, size), width in (
        ("A", lead_a, in_bytes),
        ("B", lead_b, in_bytes),
        ("the output", ("N", call.n), out_bytes),
    ):
        if (size * width) % 16:
            return (
                f"TMA needs 16-byte leading dimensions: {label}'s {dim} = {size} "
                f"x {width} bytes is not a multiple of 16"
            )
    return ""


def why_xla(dev: DeviceInfo, call: Call, overrides: dict, op: str) -> str:
    """Why no kernel can take this call at all ("" if one may): the checks
    every planner makes before it looks at the menu."""
    if overrides.get("path") == "xla":
        return f"the caller asked for XLA's {op}"
    if dev.platform != "cuda":
        return f"the device is {dev.platform}, not a CUDA GPU"
    if dev.arch is None:
        runs = "; ".join(f"{arch} needs {tables.capabilities_text(arch)}" for arch in tables.ARCH_CAPABILITIES)
        return f"compute capability {_cc_text(dev)} has no kernel family built for it ({runs})"
    if not _ffi.with_kernels():
        return _ffi.why_no_kernels()
    if call.dtype not in tables.INPUT_DTYPES:
        return f"the kernels take {' or '.join(tables.INPUT_DTYPES)} inputs, not {call.dtype}"
    outputs = tables.OUTPUT_DTYPES[call.dtype]
    if call.out_dtype not in outputs:
        return f"the kernels write {' or '.join(outputs)} from {call.dtype} inputs, not {call.out_dtype}"
    if min(call.m, call.n, call.k, call.count) == 0:
        return "the problem is empty"
    if call.dtype in tables.BLOCK_SCALED_DTYPES:
        why = _block_scaled_problem(call)
        if why:
            return why
    return _alignment_problem(call)


def _block_scaled_problem(call: Call) -> str:
    """What keeps a block-scaled (fp8) call off its kernels: they read A and B
    K-major, K in whole scale blocks; the dense kernel runs one product and
    reads A's scales with TMA (a 16-byte row pitch: M a multiple of 4); the
    grouped ones split the rows (ragged_m) or, in the weight gradient, the
    contraction (ragged_k, its rows in the block-aligned layout of
    primitives/token_tiles.py, so K is the padded row count). MXFP8 (mxe4m3)
    reads its scales padded, so M is free; its K tile is 128, and its
    weight gradient takes the same block-aligned rows."""
    if call.epilogue != "none":
        return "block-scaled fp8 runs plain products only"
    if (call.a_major, call.b_major) != ("k", "k"):
        return "block-scaled fp8 reads A [M,K] and B [N,K] (K-major)"
    if call.problem == "dense" and call.count != 1:
        return "block-scaled fp8 dense products take no batch"
    if call.k % tables.SCALE_BLOCK:
        what = "the MX kernel's K tile" if call.dtype == tables.MX_DTYPE else "the scale block"
        return f"K = {call.k} is not a multiple of {what} {tables.SCALE_BLOCK}"
    if call.dtype == tables.MX_DTYPE:
        return ""
    if call.problem == "dense" and call.m % 4:
        return f"M = {call.m} is not a multiple of 4 (A's scales are read with TMA)"
    return ""


def _cc_text(dev: DeviceInfo) -> str:
    cc = dev.compute_capability
    return f"{cc[0]}.{cc[1]}" if cc else "unknown"


def _matches(v: tables.Variant, overrides: dict) -> bool:
    if "variant" in overrides and v.name != overrides["variant"]:
        return False
    if "tile" in overrides and tuple(overrides["tile"]) != (v.tile_m, v.tile_n, v.tile_k):
        return False
    if "cluster" in overrides and tuple(overrides["cluster"]) != (v.cluster_m, v.cluster_n):
        return False
    return "schedule" not in overrides or overrides["schedule"] in v.schedules


# Overrides that name one row: they take a row no GPU has run yet (validated: false).
PINNING_ROW = frozenset({"variant", "tile"})


def menu_rows(dev: DeviceInfo, call: Call, overrides: dict, caller: str) -> tuple[list[tables.Variant], str]:
    """The compiled rows of the device's arch for this call that match the
    overrides, or ([], why XLA runs the call instead). Overrides that match
    no row raise."""
    why = why_xla(dev, call, overrides, "dot" if call.problem == "dense" else "ragged_dot")
    if why:
        return [], why
    kind = ("" if call.problem == "dense" else f"{call.problem} ") + (
        "" if call.epilogue == "none" else f"{call.epilogue} "
    )
    compiled = _ffi.compiled_variant_names()
    rows = [
        v
        for v in tables.load_menu()
        if v.name in compiled
        and v.arch == dev.arch
        and v.problem == call.problem
        and v.epilogue == call.epilogue
        and (v.dtype, v.out, v.a_major, v.b_major) == (call.dtype, call.out_dtype, call.a_major, call.b_major)
    ]
    if not rows:
        return [], (
            f"no compiled {dev.arch} {kind}variant for {call.dtype}->{call.out_dtype} with "
            f"A {call.a_major}-major and B {call.b_major}-major"
        )
    rows = [v for v in rows if _matches(v, overrides)]
    if not rows:
        raise ValueError(
            f"{caller}: no compiled {kind}variant matches {overrides}; the menu is in {tables.MENU_PATH.name}"
        )
    if not PINNING_ROW & set(overrides):
        unvalidated = [v.name for v in rows if not v.validated]
        rows = [v for v in rows if v.validated]
        if not rows:
            return [], (
                f"{', '.join(unvalidated)} is outside the ranking (not run on a GPU yet, or no faster than "
                "the default), so only a plan that pins it (variant= or tile=) takes it"
            )
    return rows, ""


def resident_clusters(v: tables.Variant, device: DeviceInfo) -> tuple[int, str]:
    """Clusters of `v` that fit at once: queried on a present GPU, else modelled."""
    if device.source == "queried" and _ffi.with_kernels():
        return _ffi.extension().max_active_clusters(v.name, device.device_id), "queried"
    return (device.sm_count or 0) // v.cluster_size, "modelled"


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One way to run a row: the planners rank these by `key`, lowest first."""

    key: tuple
    schedule: str
    waves: float
    efficiency: float
    splits: int = 1
    raster: str = "along_n"
    swizzle: int = 1
    memory_bound: bool = False


@dataclasses.dataclass(frozen=True)
class Choice:
    variant: tables.Variant
    clusters: int
    residency: str
    candidate: Candidate


def best_candidate(
    rows: Iterable[tables.Variant], dev: DeviceInfo, options: Callable[[tables.Variant, int], Iterable[Candidate]]
) -> tuple[Choice | None, list[str]]:
    """The lowest-keyed candidate over every row that can be resident, and
    notes on the rows that cannot (smaller clusters and 1-CTA rows stay in)."""
    best, notes = None, []
    for v in rows:
        clusters, residency = resident_clusters(v, dev)
        if clusters < 1:
            notes.append(
                f"{v.name}: no {v.cluster_m}x{v.cluster_n} cluster can be resident ({residency}), not considered"
            )
            continue
        for candidate in options(v, clusters):
            if best is None or candidate.key < best.candidate.key:
                best = Choice(v, clusters, residency, candidate)
    return best, notes


def check_overrides(overrides: dict, allowed: tuple[str, ...], caller: str) -> None:
    """A TypeError naming the overrides a planner does not take ("path" it always does)."""
    unknown = set(overrides) - set(allowed) - {"path"}
    if unknown:
        raise TypeError(f"{caller}: unknown override(s) {sorted(unknown)}; choose from {allowed + ('path',)}")


def xla_plan(base: dict, reason: str, notes=()) -> Plan:
    """The plan that runs XLA's op for the call described by `base`, and why."""
    return Plan(**base, path="xla", reason=reason, notes=tuple(notes))


NO_RESIDENT_CANDIDATE = "no candidate variant fits on this device (cudaOccupancyMaxActiveClusters = 0)"


def kernel_plan(base: dict, choice: Choice, dev: DeviceInfo, reason: str, notes: list[str]) -> Plan:
    """The Plan that runs `choice` for the call described by `base`, with the
    scratch it needs queried from the compiled variant."""
    v, c = choice.variant, choice.candidate
    plan = Plan(
        **base,
        path="kernel",
        reason=reason,
        variant=v.name,
        arch=v.arch,
        tile_m=v.tile_m,
        tile_n=v.tile_n,
        tile_k=v.tile_k,
        cluster_m=v.cluster_m,
        cluster_n=v.cluster_n,
        stages=v.stages,
        mma=v.mma,
        schedule=c.schedule,
        splits=c.splits,
        raster=c.raster,
        swizzle=c.swizzle,
        sm_count=int(dev.sm_count or 0),
        max_active_clusters=int(choice.clusters),
        residency=choice.residency,
        waves=c.waves,
        predicted_efficiency=c.efficiency,
        memory_bound=c.memory_bound,
        kind=v.kind,
        swap_ab=v.swap_ab,
        notes=tuple(notes),
    )
    count = plan.groups if plan.problem != "dense" else plan.batch
    workspace = _ffi.extension().workspace_size(plan.ffi_attrs(), plan.m, plan.n, plan.k, count)
    return dataclasses.replace(plan, workspace_bytes=int(workspace))


def call_base(call: Call, dev: DeviceInfo) -> dict:
    """The Plan fields that describe the call (see Plan)."""
    dense = call.problem == "dense"
    return dict(
        m=int(call.m),
        n=int(call.n),
        k=int(call.k),
        batch=int(call.count) if dense else 1,
        groups=0 if dense else int(call.count),
        dtype=call.dtype,
        out_dtype=call.out_dtype,
        a_major=call.a_major,
        b_major=call.b_major,
        problem=call.problem,
        epilogue=call.epilogue,
        device=dev,
    )
