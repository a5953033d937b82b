"""Measured routing of dense GEMMs between the kernel and XLA's dot, and of
grouped GEMMs between the grouped kernel and XLA's ragged_dot.

cuBLAS is near the card's power-limited ceiling on large compute-bound GEMMs,
where our kernels trail it by a few per cent; they win on small problems and
few-wave tails. The rule is measured, not modelled: `routing.json` holds, per
device, for each operand layout and for memory- or compute-bound problems, the
window of contraction lengths (log2 K) where the kernel measured faster than
XLA's dot. It is fitted by `benchmarks/fit_routing.py` on part of the dense
suite (`benchmarks/bench_dense_suite.py`) and checked on model families it
never saw. A device measured by none takes the entry of one of its compute
capability (the same SMs and the same cuBLAS kernels, so the two paths
compare as they did there: XLA's dot wherever the measured device found it
faster, which keeps the promise never to be slower than it); a capability
or layout without an entry keeps the kernel.

XLA runs a grouped product as a dense expansion: every row against every
group's weights (G times the dense product's FLOPs, and all G weights read).
That is cheap for small layers, where the grouped kernel's fixed costs (its
preparation kernel, counter and a persistent grid) dominate. Per device,
`routing.json` holds the modelled expansion time (`expansion_seconds`)
under which XLA's ragged_dot measured faster, fitted by
`benchmarks/bench_ragged_routing.py --fit` on part of its rows. Larger
memory-bound ragged_m calls whose every group is expected to receive rows
also go to XLA where the expansion's FLOPs hide under its weight reads
(`streams_like_a_read`): it then reads each weight once at a plain read's
speed, faster than the kernels.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import pathlib

from jax_cluster.planning import cost_model, tables
from jax_cluster.planning.call import Call
from jax_cluster.planning.device import DeviceInfo

TABLE_PATH = pathlib.Path(__file__).with_name("routing.json")
# "measured": the rule below decides; "kernel": every call a kernel fits runs it
ROUTES = ("measured", "kernel")
ROUTE_ENV = "JAX_CLUSTER_ROUTE"
# operand majors (A, B) -> the layout names the dense suite uses
LAYOUTS = {("k", "n"): "kn", ("k", "k"): "kk", ("m", "n"): "mn", ("m", "k"): "mk"}


# With every group expected to receive rows, XLA's expansion of a ragged_m
# product reads each weight once, as the kernels do, and where its extra
# FLOPs hide under that weight stream it runs at a plain read's speed, which
# the kernels do not reach. Measured: Mixtral 8x7B's gate (8 experts) at
# 16-32 rows on an H100 (2026-12-07) and at 64 rows on the H200
# (2026-12-03), XLA 1.02-1.09x faster than every kernel, and the H200
# grouped sweep's two forward products that this adds to the threshold's,
# 1.2-1.9x; every other case in those runs kept the kernel (docs/performance.md,
# "XLA's ragged_dot for fully filled few-expert calls"). The FLOPs at the peak must fit in a third
# of the stream, as far as those cases reach (0.03-0.31 of it): the
# expansion's GEMM runs below the peak, and nothing measured beyond. Weights
# read transposed (B K-major) stay with the kernels, since the sweep's two
# such input gradients ran 1.1x slower on XLA.
STREAMED_EXPANSION_EMPTY_GROUPS = 1.0  # at most this many groups expected empty
STREAMED_EXPANSION_FLOP_SHARE = 1 / 3  # the expansion's FLOP time over its weight stream's

# XLA rewrites a dot whose contraction has one element into an elementwise
# multiply, which stored bf16 at 1.7 TB/s on the H200 (one run, 2026-12-03,
# results/h200/investigations/short_k.json: a 4096x128256 weight gradient of
# one token took 618 us), where the same product with K padded to 2 ran as a
# GEMM in 282 us. Padding costs two small copies, so only outputs this large
# (16-bit floats: f32 dots may round their inputs to TF32) take it.
PAD_UNIT_K_MIN_OUTPUTS = 1 << 23
PAD_UNIT_K_DTYPES = ("bfloat16", "float16")


def pads_unit_k(m: int, n: int, k: int, batch: int, dtype) -> bool:
    """Whether XLA's path runs a K = 1 product as a dot of K padded to 2."""
    return k == 1 and m * n * batch >= PAD_UNIT_K_MIN_OUTPUTS and str(dtype) in PAD_UNIT_K_DTYPES


@dataclasses.dataclass(frozen=True)
class Rule:
    layout: str
    memory_bound: bool
    # the kernel runs where lo <= log2(K) < hi (empty when lo == hi)
    lo: float
    hi: float


@dataclasses.dataclass(frozen=True)
class GroupedRule:
    # XLA's ragged_dot runs calls whose modelled dense expansion takes less
    xla_below_seconds: float
    evidence: str


@dataclasses.dataclass(frozen=True)
class DeviceRules:
    name: str  # a substring of the device's name ("H200")
    compute_capability: tuple[int, int]
    evidence: str  # what was measured, when, at which commit
    rules: tuple[Rule, ...]
    grouped: GroupedRule | None = None


def default_route() -> str:
    """The route of calls that name none: $JAX_CLUSTER_ROUTE, else "measured"."""
    route = os.environ.get(ROUTE_ENV, "measured")
    if route not in ROUTES:
        raise ValueError(f"${ROUTE_ENV} must be one of {ROUTES}, got {route!r}")
    return route


def parse(table: dict) -> tuple[DeviceRules, ...]:
    return tuple(
        DeviceRules(
            d["name"],
            tuple(d["compute_capability"]),
            d["evidence"],
            tuple(Rule(r["layout"], r["memory_bound"], *r["kernel_log2_k"]) for r in d["rules"]),
            GroupedRule(d["grouped"]["xla_below_us"] * 1e-6, d["grouped"]["evidence"]) if "grouped" in d else None,
        )
        for d in table["devices"]
    )


@functools.cache
def shipped() -> tuple[DeviceRules, ...]:
    return parse(json.loads(TABLE_PATH.read_text()))


def rules_for(dev: DeviceInfo, table: tuple[DeviceRules, ...] | None = None) -> DeviceRules | None:
    """The entry measured on this device, else one measured on another device
    of its compute capability (see the module docstring), else None."""
    same = [e for e in (shipped() if table is None else table) if e.compute_capability == dev.compute_capability]
    return next((e for e in same if e.name in dev.name), same[0] if same else None)


def _whose(entry: DeviceRules, dev: DeviceInfo) -> str:
    """Where the rule was measured, when not on this device."""
    if entry.name in dev.name:
        return ""
    capability = ".".join(map(str, entry.compute_capability))
    return f"; this {dev.name} has none of its own and takes the {entry.name}'s, of compute capability {capability}"


def xla_is_faster(call: Call, memory_bound: bool, dev: DeviceInfo, table=None) -> str:
    """Why XLA's dot should run `call` instead of the kernel, or "" to keep it."""
    entry = rules_for(dev, table)
    layout = LAYOUTS.get((call.a_major, call.b_major))
    if entry is None or layout is None:
        return ""
    rule = next((r for r in entry.rules if r.layout == layout and r.memory_bound == memory_bound), None)
    if rule is None:
        return ""
    size = math.log2(call.k) if call.k > 0 else 0.0
    if rule.lo <= size < rule.hi:
        return ""
    bound = "memory-bound" if memory_bound else "compute-bound"
    won = f"it won only for {2**rule.lo:g} <= K < {2**rule.hi:g}" if rule.lo < rule.hi else "it won at no K"
    return (
        f"XLA's dot is expected faster: on {entry.name} the kernel measured behind it for {bound} "
        f"{layout} GEMMs at K = {call.k} ({won}; {entry.evidence}{_whose(entry, dev)}); route='kernel' keeps the kernel"
    )


def expansion_seconds(call: Call, dev: DeviceInfo) -> float | None:
    """The modelled time of XLA's dense expansion of a grouped call: G times
    the dense product's FLOPs at the device's peak, or its bytes (all G
    weights for ragged_m, G outputs for ragged_k) at its bandwidth, whichever
    is longer; None where the device has no model."""
    edge = cost_model.ridge(dev, call.dtype)
    if edge is None:
        return None
    _, peak, bandwidth = edge
    m, n, k, groups = call.m, call.n, call.k, call.count
    size_in, size_out = (tables.DTYPE_BYTES.get(d, 2) for d in (call.dtype, call.out_dtype))
    if call.problem == "ragged_m":
        moved = (m * k + groups * k * n) * size_in + m * n * size_out
    else:
        moved = (m * k + k * n) * size_in + groups * m * n * size_out
    return max(2.0 * groups * m * n * k / peak, moved / bandwidth)


def streams_like_a_read(call: Call, dev: DeviceInfo) -> str:
    """Why XLA's expansion of a ragged_m `call` streams each weight once at a
    plain read's speed, with its FLOPs hidden under the stream (see
    STREAMED_EXPANSION_EMPTY_GROUPS), or ""."""
    edge = cost_model.ridge(dev, call.dtype)
    if edge is None or call.problem != "ragged_m" or call.b_major != "n":
        return ""
    _, peak, bandwidth = edge
    groups = call.count
    filled = cost_model.expected_filled_groups(call.m, groups)
    flops_s = 2.0 * groups * call.m * call.n * call.k / peak
    weights_s = groups * call.k * call.n * tables.DTYPE_BYTES.get(call.dtype, 2) / bandwidth
    if groups - filled > STREAMED_EXPANSION_EMPTY_GROUPS or flops_s > STREAMED_EXPANSION_FLOP_SHARE * weights_s:
        return ""
    return (
        f"{filled:.1f} of {groups} groups are expected to receive rows, so XLA's dense expansion reads each "
        f"weight once, and its extra FLOPs ({flops_s * 1e6:.1f} us at the peak) hide under that weight stream "
        f"({weights_s * 1e6:.1f} us), which it runs at a plain read's speed and the kernels do not "
        "(measured on Mixtral's 8 experts on an H100 and the H200)"
    )


def xla_ragged_is_faster(call: Call, dev: DeviceInfo, table=None) -> str:
    """Why XLA's ragged_dot should run a grouped `call` instead of the
    grouped kernel, or "" to keep the kernel."""
    entry = rules_for(dev, table)
    if entry is None or entry.grouped is None:
        return ""
    streamed = streams_like_a_read(call, dev)
    if streamed:
        return f"XLA's ragged_dot is expected faster: {streamed}; route='kernel' keeps the kernel"
    seconds = expansion_seconds(call, dev)
    if seconds is None or seconds >= entry.grouped.xla_below_seconds:
        return ""
    return (
        f"XLA's ragged_dot is expected faster: its dense expansion of this call ({call.count} groups) models at "
        f"{seconds * 1e6:.2f} us, under the {entry.grouped.xla_below_seconds * 1e6:g} us below which it measured "
        f"faster than the grouped kernel on {entry.name} ({entry.grouped.evidence}{_whose(entry, dev)}); "
        "route='kernel' keeps the kernel"
    )
