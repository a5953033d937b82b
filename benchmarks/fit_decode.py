"""Fits the decode rows' constants in jax_cluster/planning/cost_model.py
(FMA_PER_SM, DECODE_LOADED_LATENCY_S, DECODE_REDUCTION_S) on a decode run
of bench_ragged_decode.py (rows with jc_decode{2,4,8}_ms, or with
jc_fp8_decode{2,4,8}_ms for a --fp8 run, which the block-scaled decode rows
model), by a grid search
that minimises the squared log error of cost_model.decode_seconds on the
fitting configurations, then reports, for every case, the cluster size the
fitted model picks against the measured best, held-out configurations
included. It prints the constants; cost_model.py is edited by hand.

    python benchmarks/fit_decode.py benchmarks/results/h200/investigations/decode_rows.json \
        --held-out qwen3 --clusters 2:132,4:62,8:30

--clusters gives the resident clusters of each decode row as the GPU reported
them (the self-test prints them).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import bench_ragged_decode  # noqa: E402

from jax_cluster.planning import cost_model, tables  # noqa: E402
from jax_cluster.planning.device import DeviceInfo  # noqa: E402

LATENCIES = [x * 1e-7 for x in range(4, 40, 2)]
FMA_RATES = [x * 1e10 for x in (4, 5, 6, 7, 8, 10, 12)]
REDUCTIONS = [x * 1e-7 for x in (0, 1, 2, 3, 5, 8, 12, 16, 24)]


def _set(latency, fma, reduction):
    cost_model.DECODE_LOADED_LATENCY_S = latency
    cost_model.FMA_PER_SM = {"sm90a": fma}
    cost_model.DECODE_REDUCTION_S = reduction


def pinned_key(v: tables.Variant) -> str | None:
    """The benchmark's name for a decode row's pinned timing (jc_decode2, jc_fp8_decode4, ...)."""
    pins = {**bench_ragged_decode.PINNED, **bench_ragged_decode.FP8_PINNED}
    for short, pin in pins.items():
        if pin["tile"] == (v.tile_m, v.tile_n, v.tile_k) and pin.get("cluster") == (v.cluster_m, v.cluster_n):
            return short
    return None


def run_dtype(payload) -> str:
    """The decode rows' input dtype a run timed: e4m3 for a --fp8 run."""
    return "e4m3" if str(payload.get("operands", "")).startswith("e4m3") else "bf16"


def timings(payload):
    """(config, rows, n, k, experts, variant, measured seconds) per decode row and case,
    each timing paired with the row of the run's dtype (both families have clusters of 2, 4, 8)."""
    dtype = run_dtype(payload)
    rows = {pinned_key(v): v for v in tables.load_menu() if v.kind == "decode" and v.dtype == dtype}
    for r in payload["rows"]:
        for key, v in rows.items():
            if r.get(f"{key}_ms"):
                yield r["config"], r["rows"], r["n"], r["k"], r["experts"], v, r[f"{key}_ms"] * 1e-3


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=pathlib.Path, help="a bench_ragged_decode.py JSON with the decode rows pinned")
    parser.add_argument("--held-out", action="append", default=[], help="config prefix never read by the fit")
    parser.add_argument("--clusters", required=True, help="resident clusters per decode cluster size, 2:132,4:62,...")
    args = parser.parse_args()
    payload = json.loads(args.run.read_text())
    resident = {int(c): int(n) for c, n in (x.split(":") for x in args.clusters.split(","))}
    dev = DeviceInfo("cuda", payload["device"], (9, 0), 132, 232448, 50 << 20)
    points = list(timings(payload))
    fit = [p for p in points if not any(p[0].startswith(h) for h in args.held_out)]

    def predicted(p):
        _, m, n, k, groups, v, _ = p
        return cost_model.decode_seconds(v, m, n, k, groups, resident[v.cluster_m], v.dtype, v.out, dev)

    best = None
    for constants in itertools.product(LATENCIES, FMA_RATES, REDUCTIONS):
        _set(*constants)
        error = sum(math.log(predicted(p) / p[-1]) ** 2 for p in fit)
        if best is None or error < best[0]:
            best = (error, constants)
    _set(*best[1])
    latency, fma, reduction = best[1]
    print(f"DECODE_LOADED_LATENCY_S = {latency:.2e}; FMA_PER_SM = {fma:.2e}; DECODE_REDUCTION_S = {reduction:.2e}")
    print(f"fitted on {len(fit)} timings; held out: {', '.join(args.held_out) or 'none'}")
    cases = {}
    for p in points:
        cases.setdefault(p[:5], []).append((p[5].cluster_m, p[-1], predicted(p)))
    for (config, m, _, _, groups), rs in cases.items():
        measured, picked = min(rs, key=lambda r: r[1]), min(rs, key=lambda r: r[2])
        held = " (held out)" if any(config.startswith(h) for h in args.held_out) else ""
        per_group = cost_model.expected_rows_per_group(m, groups)
        print(
            f"{config:<22} {m:>5} rows / {groups:<4} groups ({per_group:4.1f} per group): best c{measured[0]} "
            f"{measured[1] * 1e6:8.1f} us, model picks c{picked[0]} ({picked[1] * 1e6:8.1f} us measured, "
            f"{picked[2] * 1e6:8.1f} modelled){held}"
        )


if __name__ == "__main__":
    main()
