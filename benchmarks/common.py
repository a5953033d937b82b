"""Shared benchmark plumbing: CUPTI device time, input rotation, JSON + PNG."""
from __future__ import annotations

import json
import math
import pathlib
import statistics

import jax
import jax.numpy as jnp

L2_FLUSH_BYTES = 256 << 20   # rotate inputs until they exceed every L2 by far


def device_ms(fn, args_list, iterations=10):
    """Median device time of one call, from CUPTI kernel activity.

    `fn` runs once per entry of `args_list` inside one jit, so the inputs
    rotate and small problems are not timed out of a warm L2.
    """
    from jax.experimental.mosaic.gpu import profiler

    @jax.jit
    def rotated(args_list):
        return [fn(*args) for args in args_list]

    _, timings = profiler.measure(rotated, iterations=iterations)(args_list)
    per_iter = timings if isinstance(timings, list) else [timings]
    return statistics.median(per_iter) / len(args_list)


def rotation(bytes_per_set: int) -> int:
    return max(1, min(16, math.ceil(L2_FLUSH_BYTES / max(bytes_per_set, 1))))


def device_name() -> str:
    return jax.devices()[0].device_kind


def write_results(out_dir: pathlib.Path, stem: str, payload: dict, plot) -> list[pathlib.Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{stem}.json"
    json_path.write_text(json.dumps(payload, indent=1))
    png_path = out_dir / f"{stem}.png"
    plot(payload, png_path)
    return [json_path, png_path]


def randn(key, shape, dtype):
    return jax.random.normal(key, shape, jnp.float32).astype(dtype)
