"""Shared benchmark plumbing: the device, the results folder, JSON + PNG (and
their manifest entries), paired-bar plots, random operands.

Device time comes from jax_cluster.tuning.timing (CUPTI, rotated inputs), as
autotune's does; relative errors from jax_cluster.tuning.accuracy.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import shlex
import subprocess
import sys

import jax
import jax.numpy as jnp
import manifest

HERE = pathlib.Path(__file__).resolve().parent


def device_name() -> str:
    return jax.devices()[0].device_kind


def results_dir(out: pathlib.Path | None = None) -> pathlib.Path:
    """`out`, or benchmarks/results/<device>/."""
    return out if out is not None else manifest.RESULTS / manifest.device_slug(device_name())


def add_route_argument(parser) -> None:
    """--route: what the dense calls run. "measured" is what a user gets (XLA's
    dot where it measured faster, jax_cluster/planning/routing.json); "kernel"
    times the kernels wherever one fits."""
    parser.add_argument("--route", choices=("measured", "kernel"), default="measured", help=add_route_argument.__doc__)


def route_stem(base: str, route: str) -> str:
    """`base`, or `base`_kernel for a run with --route kernel."""
    return base if route == "measured" else f"{base}_{route}"


def set_route(route: str) -> None:
    """Every plan this process makes from now on takes `route` (JAX_CLUSTER_ROUTE)."""
    os.environ["JAX_CLUSTER_ROUTE"] = route


def add_out_argument(parser) -> None:
    parser.add_argument(
        "--out", type=pathlib.Path, default=None, help="output folder (default: benchmarks/results/<gpu>)"
    )


def driver_version() -> str | None:
    """The CUDA driver's version as jax's CUDA plugin reports it (cudaDriverGetVersion), or None."""
    try:
        from jax._src.lib import cuda_versions

        version = cuda_versions.cuda_driver_get_version()
    except Exception:  # no CUDA plugin, or a jax without this module
        return None
    return f"{version // 1000}.{version % 1000 // 10}"


def _git_commit() -> str | None:
    def git(*args):
        return subprocess.run(["git", *args], cwd=HERE, capture_output=True, text=True, timeout=30).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        return (head + ("+" if git("status", "--porcelain", "--untracked-files=no") else "")) or None
    except (OSError, subprocess.SubprocessError):
        return None


def run_record() -> dict:
    """What the manifest says of a run of this process."""
    flags = os.environ.get("XLA_FLAGS", "").strip()
    # JAX_CLUSTER_COMMIT names the commit when the tree runs without its .git
    # (a copy on a GPU machine); else git says, with "+" for uncommitted changes.
    commit = os.environ.get("JAX_CLUSTER_COMMIT") or _git_commit()
    script = pathlib.Path(sys.argv[0]).resolve()
    repo = HERE.parent
    return {
        "benchmark": script.relative_to(repo).as_posix() if script.is_relative_to(repo) else script.name,
        "command": ((f"XLA_FLAGS={shlex.quote(flags)} " if flags else "") + shlex.join(["python", *sys.argv])),
        "commit": commit,
        "date": datetime.datetime.now(datetime.UTC).date().isoformat(),
        "jax_version": jax.__version__,
        "device": device_name(),
        "driver": driver_version(),
    }


def write_results(out_dir: pathlib.Path, stem: str, payload: dict, plot) -> list[pathlib.Path]:
    """`stem`.json, and `stem`.png from `plot(payload, path)` where matplotlib is
    there (the JSON is the record); their manifest entries say how they were made."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.json"]
    paths[0].write_text(json.dumps(payload, indent=1))
    try:
        plot(payload, out_dir / f"{stem}.png")
        paths.append(out_dir / f"{stem}.png")
    except ImportError as e:
        print(f"no plot ({e})")
    manifest.record(paths, run_record())
    for path in paths:
        print("wrote", path)
    return paths


def plot_pairs(path, labels, baseline, ours, *, baseline_label, ours_label="jax_cluster", ratios=None, ylabel, title):
    """Two bars per case (a baseline and jax_cluster), each pair labelled with
    its ratio when `ratios` is given; written as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = range(len(labels))
    fig, ax = plt.subplots(figsize=(max(8, 1.0 * len(labels)), 5))
    ax.bar([x - 0.2 for x in xs], baseline, 0.4, label=baseline_label)
    ax.bar([x + 0.2 for x in xs], ours, 0.4, label=ours_label)
    for x, value, ratio in zip(xs, ours, ratios or []):
        ax.annotate(f"{ratio:.2f}x", (x + 0.2, value), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(xs), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def results_stem(base: str, xla_flags: str) -> str:
    """`base`, or `base`_nocb for a run with XLA's command buffers turned off."""
    return base + ("_nocb" if "enable_command_buffer=" in xla_flags else "")


def randn(key, shape, dtype):
    return jax.random.normal(key, shape, jnp.float32).astype(dtype)
