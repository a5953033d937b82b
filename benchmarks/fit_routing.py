"""Fits the dense routing rule (jax_cluster/planning/routing.json) on the
dense suite's fitting families: for each operand layout and for memory- or
compute-bound calls, the window of log2(K) where the kernel runs. A window must
gain at least MIN_GAIN on average over XLA's path to be kept, so a few rows won
by noise never open one. Held-out families are never read.

With --score, the suite's rows are then scored on the new rule from the two
paths the run measured for each (`kernel_ms`, `routed_xla_ms`: run it with
--both-paths): each row's `path` and `jc_ms` become what a default call
takes under the new rule, and the summary is recomputed (held-out rows
included, which the fit never read).

    python benchmarks/fit_routing.py benchmarks/results/h200/dense_suite.json --device H200
    python benchmarks/fit_routing.py benchmarks/results/h200/dense_suite.json --device H200 --score
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import pathlib
import sys

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
    parser.add_argument("--score", action="store_true", help="rewrite the suite's default paths under the new rule")
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
    if args.score:
        score(args.suite, payload, table)


def score(path: pathlib.Path, payload: dict, table: dict) -> None:
    """Rewrites the suite's default paths and summary under `table`'s rule."""
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    import bench_dense_suite  # the suite's summary; imports jax

    from jax_cluster.planning import routing
    from jax_cluster.planning.call import Call
    from jax_cluster.planning.device import DeviceInfo

    rules = routing.parse(table)
    entry = next(d for d in rules if d.name in payload["device"])
    dev = DeviceInfo("cuda", payload["device"], entry.compute_capability, 0, 0, 0)
    for r in payload["rows"]:
        if not (r.get("kernel_ms") and r.get("routed_xla_ms")):
            continue
        a_major, b_major = bench_dense_suite.MAJORS[r["layout"]]
        call = Call("dense", r["m"], r["n"], r["k"], 1, a_major, b_major, "bf16", "bf16")
        why = routing.xla_is_faster(call, r["memory_bound"], dev, rules)
        r["path"], r["jc_ms"] = ("xla", r["routed_xla_ms"]) if why else ("kernel", r["kernel_ms"])
        r["reason"] = why or "the kernel: the refitted rule keeps it for this call"
    payload["summary"] = bench_dense_suite.summary(payload["rows"])
    payload["scored_with"] = f"routing rule fitted after the run ({entry.evidence}); paths measured in the run"
    path.write_text(json.dumps(payload, indent=1))
    print(json.dumps(payload["summary"], indent=1))


if __name__ == "__main__":
    main()
