"""Shared benchmark plumbing: CUPTI device time, input rotation, JSON + PNG."""
from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp

from jax_cluster._timing import cupti_ms, rotation  # noqa: F401  (shared with autotune)


def device_ms(fn, args_list, iterations=10):
    """Median device time of one call, from CUPTI kernel activity.

    `fn` runs once per entry of `args_list` inside one jit, so the inputs
    rotate and small problems are not timed out of a warm L2.
    """
    return cupti_ms(fn, args_list, iterations)


def device_name() -> str:
    return jax.devices()[0].device_kind


def write_results(out_dir: pathlib.Path, stem: str, payload: dict, plot) -> list[pathlib.Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{stem}.json"
    json_path.write_text(json.dumps(payload, indent=1))
    png_path = out_dir / f"{stem}.png"
    plot(payload, png_path)
    return [json_path, png_path]


def plot_pairs(path, labels, baseline, ours, *, baseline_label, ours_label="jax_cluster",
               ratios=None, ylabel, title):
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
