"""Fits the dense routing rule (jax_cluster/planning/routing.json) on the
dense suite's fitting families: for each operand layout and for memory- or
compute-bound calls, the window of log2(K) where the kernel runs. A window must
gain at least MIN_GAIN on average over XLA's path to be kept, so a few rows won
by noise never open one. Held-out families are never read.

    python benchmarks/fit_routing.py benchmarks/results/h200/dense_suite.json --device H200
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import pathlib

TABLE = pathlib.Path(__file__).parents[1] / "jax_cluster" / "planning" / "routing.json"
MIN_GAIN = math.log(1.03)


def fit_class(rows):
    """(lo, hi): the log2(K) window that maximises the measured log-speedup."""

    def gain(r):  # kernel over the call's own XLA path, both measured in one run
        return math.log(r["routed_xla_ms"] / r["kernel_ms"])

    edges = sorted({math.log2(r["k"]) for r in rows})
    best, window = 0.0, (0.0, 0.0)
    for i, lo in enumerate(edges):
        for hi in edges[i:]:
            inside = [gain(r) for r in rows if lo <= math.log2(r["k"]) <= hi]
            total = sum(inside)
            if inside and total / len(inside) >= MIN_GAIN and total > best:
                best, window = total, (lo, hi + 0.5)
    return window


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite", type=pathlib.Path, help="dense_suite.json with kernel_ms and routed_xla_ms")
    parser.add_argument("--device", required=True, help="a substring of the device name, e.g. H200")
    parser.add_argument("--compute-capability", default="9.0")
    args = parser.parse_args()
    payload = json.loads(args.suite.read_text())
    rows = [r for r in payload["rows"] if not r["held_out"] and r.get("kernel_ms") and r.get("routed_xla_ms")]
    rules = []
    for layout in ("kn", "kk", "mn"):
        for bound in (False, True):
            cls = [r for r in rows if r["layout"] == layout and bool(r["memory_bound"]) == bound]
            if cls:
                lo, hi = fit_class(cls)
                rules.append({"layout": layout, "memory_bound": bound, "kernel_log2_k": [lo, hi], "rows": len(cls)})
    when = datetime.date.today().isoformat()
    evidence = f"dense suite {when}, commit {payload.get('commit')}, {len(rows)} GEMMs of the fitting families"
    entry = {
        "name": args.device,
        "compute_capability": [int(x) for x in args.compute_capability.split(".")],
        "evidence": evidence,
        "rules": rules,
    }
    table = json.loads(TABLE.read_text())
    table["devices"] = [d for d in table["devices"] if d["name"] != args.device] + [entry]
    TABLE.write_text(json.dumps(table, indent=1) + "\n")
    for r in rules:
        print(r)


if __name__ == "__main__":
    main()
