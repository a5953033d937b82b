"""The planner for grouped GEMMs (ragged_dot): which compiled grouped variant
runs a ragged problem, or why XLA's ragged_dot does.

A ragged plan describes its GEMM view (m, n, k) plus the group count:
  ragged_m  out[M,N]: the rows of A [M,K] fall into groups, group g times B[g]
            (ragged_dot forward and d_lhs): (m, n, k) = (M, N, K).
  ragged_k  out[G,K',N'] = A_g^T B_g over the rows of group g (d_rhs), A stored
            [M,K'] and B [M,N']: (m, n, k) = (K', N', M).
Group sizes live on the device, so the model assumes evenly filled groups.
"""
from __future__ import annotations

import dataclasses

from jax_cluster import _ffi, variants
from jax_cluster.device import describe
from jax_cluster.plan import Plan, dtype_name, menu_rows, _resident_clusters, _score

RAGGED_PROBLEMS = ("ragged_m", "ragged_k")
DEFAULT_A_MAJOR = {"ragged_m": "k", "ragged_k": "m"}
_OVERRIDABLE = ("variant", "tile", "cluster")


def _schedule(v: variants.Variant) -> str:
    """A grouped kind runs one schedule: sm90's work queue, sm100's CLC."""
    (schedule,) = v.schedules
    return schedule


def _modelled(v: variants.Variant, m, n, k, groups, problem, clusters):
    """(time, waves, efficiency) from the dense model, for evenly filled groups."""
    if problem == "ragged_k":  # one K'xN' output per group, each over ~M/G rows
        return _score(v, m, n, k, groups, clusters, _schedule(v), 1)
    # ragged_m: each group's last cluster tile along M is on average half empty
    rows = m + (min(groups, m) - 1) * v.cta_tile_m * v.cluster_m // 2
    time, waves, eff = _score(v, rows, n, k, 1, clusters, _schedule(v), 1)
    return time, waves, eff * m / rows


def plan_ragged(m: int, n: int, k: int, groups: int, *, problem: str, dtype, out_dtype=None,
                b_major: str = "n", a_major: str | None = None, device=None,
                **overrides) -> Plan:
    """Chooses among the compiled grouped variants for one ragged problem.

    (m, n, k) is the GEMM view described in this module's docstring; `groups`
    is G. `overrides` pins variant, tile=(m,n,k) or cluster=(m,n); path="xla"
    forces the fallback. Grouped kernels schedule dynamically: sm90a through a
    work queue ("dynamic"), sm100a through Cluster Launch Control ("clc").
    """
    if problem not in RAGGED_PROBLEMS:
        raise ValueError(f"plan_ragged(): problem must be one of {RAGGED_PROBLEMS}, "
                         f"got {problem!r}")
    unknown = set(overrides) - set(_OVERRIDABLE) - {"path"}
    if unknown:
        raise TypeError(f"plan_ragged(): unknown override(s) {sorted(unknown)}; "
                        f"choose from {_OVERRIDABLE + ('path',)}")
    a_major = a_major or DEFAULT_A_MAJOR[problem]
    dev = describe(device)
    dt = dtype_name(dtype)
    out = dtype_name(out_dtype if out_dtype is not None else dtype)
    base = dict(m=int(m), n=int(n), k=int(k), batch=1, dtype=dt, out_dtype=out, a_major=a_major,
                b_major=b_major, device=dev, problem=problem, groups=int(groups))

    def fallback(reason: str) -> Plan:
        return Plan(path="xla", reason=reason, **base)

    # group g's rows start at a multiple of the row pitch, so TMA's rule covers every group
    candidates, why = menu_rows(dev, problem, dt, out, (m, n, k, groups), a_major, b_major,
                                overrides, "plan_ragged()")
    if why:
        return fallback(why)
    arch = dev.arch

    best, notes = None, []
    for v in candidates:
        clusters, residency = _resident_clusters(v, dev)
        if clusters < 1:
            notes.append(f"{v.name}: no {v.cluster_m}x{v.cluster_n} cluster can be resident "
                         f"({residency}), not considered")
            continue
        time, waves, eff = _modelled(v, m, n, k, groups, problem, clusters)
        if best is None or time < best[0]:
            best = (time, v, clusters, residency, waves, eff)
    if best is None:
        return dataclasses.replace(fallback(
            "no candidate variant fits on this device (cudaOccupancyMaxActiveClusters = 0)"),
            notes=tuple(notes))
    _, v, clusters, residency, waves, eff = best
    notes.append("waves and efficiency are modelled for evenly filled groups; the sizes are "
                 "only known on the device")
    plan = Plan(path="kernel", reason="", **base, variant=v.name, arch=arch, tile_m=v.tile_m,
                tile_n=v.tile_n, tile_k=v.tile_k, cluster_m=v.cluster_m, cluster_n=v.cluster_n,
                stages=v.stages, mma=v.mma, schedule=_schedule(v), splits=1, raster="along_m",
                swizzle=1, sm_count=int(dev.sm_count), max_active_clusters=int(clusters),
                residency=residency, waves=waves, predicted_efficiency=eff, notes=tuple(notes))
    reason = (f"{v.name} fits: {groups} groups over {clusters} resident "
              f"{v.cluster_m}x{v.cluster_n} clusters, {_schedule(v)} schedule, modelled efficiency "
              f"{eff:.0%}")
    ws = _ffi.extension().workspace_size(plan.ffi_attrs(), plan.m, plan.n, plan.k, plan.groups)
    return dataclasses.replace(plan, reason=reason, workspace_bytes=int(ws))
