"""The autotune cache: the fastest overrides per device, shape and dtypes, on disk.

`jax_cluster.autotune` writes it. The binders of the primitives read it
where a call is planned (the planner itself never imports this module), and
only when asked:
`jax_cluster.use_autotune_cache(True)`, or JAX_CLUSTER_AUTOTUNE=1 in the
environment; plans are made when jit traces, so turn it on before that.

The file is $JAX_CLUSTER_CACHE_DIR/autotune.json (default
~/.cache/jax_cluster/autotune.json):

    {"format": 1,
     "entries": {
       "NVIDIA H200 cc9.0 132SMs | 4096x4096x4096 batch 1 | bf16->bf16 | A k-major B n-major": {
         "overrides": {"variant": "...", "schedule": "static", "raster": "along_n", "swizzle": 8},
         "ms": 0.171, "runner_up": {...}, "runner_up_ms": 0.173, "xla_ms": 0.168,
         "timer": "cupti", "date": "2026-01-01T00:00:00+00:00", "jax_cluster": "0.1.0", ...}}}

"overrides" is what `jax_cluster.plan(..., **overrides)` takes; {"path": "xla"}
records that XLA's dot won.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import tempfile
import warnings

from jax_cluster.planning.dense import plan_gemm
from jax_cluster.planning.device import DeviceInfo
from jax_cluster.planning.plan import Plan, dtype_name

FORMAT = 1
ENV_ENABLE = "JAX_CLUSTER_AUTOTUNE"
ENV_DIR = "JAX_CLUSTER_CACHE_DIR"

_reading: bool | None = None  # None: follow JAX_CLUSTER_AUTOTUNE
_parsed: dict = {}  # path -> ((mtime_ns, size), entries): parse once per change
_warned_stale: set[str] = set()


def use_autotune_cache(enabled: bool | None = True) -> None:
    """Turns reading the cache on or off in this process (None: follow the
    JAX_CLUSTER_AUTOTUNE environment variable again)."""
    global _reading
    _reading = None if enabled is None else bool(enabled)


def reading_enabled() -> bool:
    if _reading is not None:
        return _reading
    return os.environ.get(ENV_ENABLE, "").strip().lower() in ("1", "true", "yes", "on")


def cache_path() -> pathlib.Path:
    root = os.environ.get(ENV_DIR)
    if root:
        return pathlib.Path(root).expanduser() / "autotune.json"
    return pathlib.Path.home() / ".cache" / "jax_cluster" / "autotune.json"


def cache_key(
    m: int,
    n: int,
    k: int,
    *,
    dtype,
    out_dtype=None,
    batch: int = 1,
    a_major: str = "k",
    b_major: str = "n",
    device_info: DeviceInfo,
) -> str:
    """A readable key: the device (name, compute capability, SMs), the problem and its dtypes."""
    dt = dtype if isinstance(dtype, str) else dtype_name(dtype)
    out = dt if out_dtype is None else (out_dtype if isinstance(out_dtype, str) else dtype_name(out_dtype))
    cc = device_info.compute_capability
    cc_text = f"{cc[0]}.{cc[1]}" if cc else "?"
    return (
        f"{device_info.name} cc{cc_text} {device_info.sm_count}SMs | "
        f"{int(m)}x{int(n)}x{int(k)} batch {int(batch)} | {dt}->{out} | "
        f"A {a_major}-major B {b_major}-major"
    )


def load_entries(path: pathlib.Path | None = None) -> dict:
    """The cache's entries; {} when the file is missing, and a warning too when
    it cannot be read. The result is shared: copy it before changing it."""
    path = pathlib.Path(path) if path is not None else cache_path()
    try:
        stat = path.stat()
    except OSError:
        return {}
    stamp = (stat.st_mtime_ns, stat.st_size)
    if path in _parsed and _parsed[path][0] == stamp:
        return _parsed[path][1]
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
            raise ValueError(f"expected {{'format': {FORMAT}, 'entries': {{...}}}}")
        entries = data["entries"]
    except (OSError, ValueError, AttributeError) as exc:  # AttributeError: not a JSON object
        warnings.warn(
            f"jax_cluster: the autotune cache {path} cannot be read ({exc}); "
            "treating it as empty (the next autotune() rewrites it)",
            RuntimeWarning,
            stacklevel=2,
        )
        entries = {}
    _parsed[path] = (stamp, entries)
    return entries


def record(key: str, entry: dict, path: pathlib.Path | None = None) -> pathlib.Path:
    """Adds or replaces one entry; the file is replaced atomically, so a reader
    never sees half of it."""
    path = pathlib.Path(path) if path is not None else cache_path()
    entries = {**load_entries(path), key: entry}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".autotune.", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"format": FORMAT, "entries": entries}, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    _parsed.pop(path, None)
    return path


def _cached_overrides(key: str) -> dict | None:
    entry = load_entries().get(key)
    if not isinstance(entry, dict) or not isinstance(entry.get("overrides"), dict):
        return None
    return dict(entry["overrides"])


def lookup(m: int, n: int, k: int, *, device_info: DeviceInfo, **problem) -> dict | None:
    """The cached overrides for this problem (`problem`: cache_key's dtype,
    out_dtype, batch, a_major, b_major), or None; also whenever reading is off."""
    if not reading_enabled() or device_info.platform != "cuda":
        return None
    return _cached_overrides(cache_key(m, n, k, device_info=device_info, **problem))


def plan_from_cache(m: int, n: int, k: int, *, device_info: DeviceInfo, **problem) -> Plan | None:
    """The plan the cached overrides give, noted as such; None without an entry.

    An entry the planner now rejects (a variant no longer compiled, say) is
    ignored with a warning rather than failing every call of that shape.
    """
    if not reading_enabled() or device_info.platform != "cuda":
        return None
    key = cache_key(m, n, k, device_info=device_info, **problem)
    overrides = _cached_overrides(key)
    if not overrides:
        return None
    try:
        plan = plan_gemm(m, n, k, device=device_info, **problem, **overrides)
    except (TypeError, ValueError) as exc:
        if key not in _warned_stale:
            _warned_stale.add(key)
            warnings.warn(
                f"jax_cluster: ignoring the autotune cache entry {key!r} in {cache_path()}: {exc}",
                RuntimeWarning,
                stacklevel=3,
            )
        return None
    note = f"overrides from the autotune cache ({cache_path()})"
    return dataclasses.replace(plan, notes=plan.notes + (note,))
