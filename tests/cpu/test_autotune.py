"""jax_cluster.autotune and its cache: the key, the file, the planner's hook and
the candidates on a described H200; the tuning loop on the CPU with the H200's
candidates (wall time). tests/gpu/test_gpu_tools.py tunes a small shape for real."""

import dataclasses
import io
import json
import warnings

import jax
import jax.numpy as jnp
import pytest

import jax_cluster
from jax_cluster import _ffi
from jax_cluster.planning import autotune_cache, tables
from jax_cluster.planning.device import DeviceInfo
from jax_cluster.tuning import autotuner
from jax_cluster.tuning.progress import TextBar, progress_bar

needs_kernels = pytest.mark.skipif(not _ffi.with_kernels(), reason="built without kernels")

H200 = DeviceInfo("cuda", "described cc (9, 0)", (9, 0), 132, 232448, 50 << 20)
BIG = (4096, 4096, 4096)
PROBLEM = dict(dtype=jnp.bfloat16, out_dtype=None, batch=1, a_major="k", b_major="n")


@pytest.fixture(autouse=True)
def cache_dir(autotune_cache_dir):
    """Every test gets its own cache folder and starts with reading off."""
    return autotune_cache_dir


def key(m=4096, n=4096, k=4096, **changes):
    return autotune_cache.cache_key(m, n, k, **{**PROBLEM, "device_info": H200, **changes})


def lookup(m=4096, n=4096, k=4096):
    return autotune_cache.lookup(m, n, k, **PROBLEM, device_info=H200)


def plan(**overrides):
    return jax_cluster.plan(*BIG, dtype=jnp.bfloat16, device=H200, **overrides)


def cache_notes(p):
    return [note for note in p.notes if "autotune cache" in note]


# --------------------------------------------------------------------------- the cache


def test_cache_key_names_device_problem_and_dtypes():
    k = key()
    for part in (
        "described cc (9, 0)",
        "cc9.0",
        "132SMs",
        "4096x4096x4096",
        "batch 1",
        "bf16->bf16",
        "A k-major B n-major",
    ):
        assert part in k, (part, k)
    others = [
        key(m=2048),
        key(n=2048),
        key(k=2048),
        key(batch=2),
        key(dtype=jnp.float16),
        key(out_dtype=jnp.float32),
        key(a_major="m"),
        key(b_major="k"),
        key(device_info=dataclasses.replace(H200, name="NVIDIA H100")),
        key(device_info=dataclasses.replace(H200, compute_capability=(10, 0))),
        key(device_info=dataclasses.replace(H200, sm_count=114)),
    ]
    assert len({k, *others}) == len(others) + 1  # each fact changes the key
    assert key(dtype="bf16", out_dtype="bf16") == k  # names and dtypes give one key


def test_record_then_lookup_roundtrip(cache_dir):
    entry = {"overrides": {"path": "xla"}, "ms": 1.5, "timer": "cupti"}
    path = autotune_cache.record(key(), entry)
    assert path == cache_dir / "autotune.json" == autotune_cache.cache_path()
    assert json.loads(path.read_text()) == {"format": 1, "entries": {key(): entry}}
    assert [p.name for p in cache_dir.iterdir()] == ["autotune.json"]  # no temp file left
    assert lookup() is None  # reading is off by default
    jax_cluster.use_autotune_cache(True)
    assert lookup() == {"path": "xla"} and lookup(m=2048) is None
    autotune_cache.record(key(m=2048), {"overrides": {"schedule": "static"}})
    assert set(autotune_cache.load_entries()) == {key(), key(m=2048)}  # a second keeps the first
    assert lookup(m=2048) == {"schedule": "static"}


def test_reading_is_switched_by_env_and_by_call(monkeypatch):
    assert not autotune_cache.reading_enabled()
    monkeypatch.setenv("JAX_CLUSTER_AUTOTUNE", "1")
    assert autotune_cache.reading_enabled()
    jax_cluster.use_autotune_cache(False)  # the call wins over the environment
    assert not autotune_cache.reading_enabled()
    jax_cluster.use_autotune_cache(None)
    assert autotune_cache.reading_enabled()


def test_default_path_is_under_the_home_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("JAX_CLUSTER_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert autotune_cache.cache_path() == tmp_path / ".cache" / "jax_cluster" / "autotune.json"


def test_missing_file_reads_as_empty_without_a_warning():
    jax_cluster.use_autotune_cache(True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert lookup() is None


@pytest.mark.parametrize(
    "content", [b"{not json", b"[]", b'{"format": 99, "entries": {}}', b'{"format": 1, "entries": []}', b"\xff\xfe"]
)
def test_corrupt_file_reads_as_empty_and_is_rewritten(cache_dir, content):
    (cache_dir / "autotune.json").write_bytes(content)
    jax_cluster.use_autotune_cache(True)
    with pytest.warns(RuntimeWarning, match="cannot be read"):
        assert lookup() is None
    autotune_cache.record(key(), {"overrides": {"path": "xla"}})
    assert lookup() == {"path": "xla"}


# --------------------------------------------------------------------------- the planner's hook


@needs_kernels
def test_planner_reads_the_cache_only_when_turned_on(cache_dir, monkeypatch):
    default = plan()
    pick = next(
        c
        for c in autotuner.candidates(*BIG, dtype=jnp.bfloat16, device=H200)
        if "variant" in c
        and (c["variant"], c["schedule"], c["raster"]) != (default.variant, default.schedule, default.raster)
    )
    autotune_cache.record(key(), {"overrides": pick, "ms": 1.0})
    assert plan() == default and not cache_notes(default)  # off by default

    jax_cluster.use_autotune_cache(True)
    tuned = plan()
    assert (tuned.variant, tuned.schedule, tuned.raster, tuned.swizzle) == (
        pick["variant"],
        pick["schedule"],
        pick["raster"],
        pick["swizzle"],
    )
    path = cache_dir / "autotune.json"
    assert cache_notes(tuned) == [f"overrides from the autotune cache ({path})"]
    assert not cache_notes(plan(schedule="static"))  # the caller's overrides win
    h100 = dataclasses.replace(H200, sm_count=114)
    other = jax_cluster.plan(*BIG, dtype=jnp.bfloat16, device=h100)
    assert not cache_notes(other)  # another device, another key

    jax_cluster.use_autotune_cache(None)
    monkeypatch.setenv("JAX_CLUSTER_AUTOTUNE", "1")
    assert plan() == tuned


@needs_kernels
def test_a_cached_xla_win_sends_the_call_to_xla():
    autotune_cache.record(key(), {"overrides": {"path": "xla"}, "ms": 1.0})
    jax_cluster.use_autotune_cache(True)
    p = plan()
    assert p.path == "xla" and cache_notes(p)


@needs_kernels
def test_a_stale_entry_is_ignored_with_one_warning():
    autotune_cache.record(key(), {"overrides": {"variant": "no_such_variant"}, "ms": 1.0})
    default = plan()
    jax_cluster.use_autotune_cache(True)
    with pytest.warns(RuntimeWarning, match="ignoring the autotune cache entry"):
        assert plan() == default
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plan() == default


# --------------------------------------------------------------------------- candidates


@needs_kernels
def test_candidates_on_an_h200_are_its_compiled_sm90_variants_and_xla():
    found = autotuner.candidates(*BIG, dtype=jnp.bfloat16, device=H200)
    assert found[-1] == {"path": "xla"} and found.count({"path": "xla"}) == 1
    kernels = found[:-1]
    assert len({json.dumps(c, sort_keys=True) for c in kernels}) == len(kernels)  # no repeats
    menu = {v.name: v for v in tables.load_menu()}
    expected = {
        v.name
        for v in menu.values()
        if v.name in _ffi.compiled_variant_names()
        and v.arch == "sm90a"
        and v.problem == "dense"
        and v.epilogue == "none"
        and (v.dtype, v.out, v.a_major, v.b_major) == ("bf16", "bf16", "k", "n")
    }
    assert expected and {c["variant"] for c in kernels} == expected
    for name in expected:
        for schedule in menu[name].schedules:
            for raster in ("along_m", "along_n"):
                chosen = [c for c in kernels if (c["variant"], c["schedule"], c["raster"]) == (name, schedule, raster)]
                splits = sorted(c.get("splits", 1) for c in chosen)
                assert splits == ([2, 4] if schedule == "split_k" else [1]), (name, schedule)
    for c in kernels:  # each replays to the plan it names
        p = plan(**c)
        assert p.path == "kernel" and (p.variant, p.schedule, p.raster, p.swizzle) == (
            c["variant"],
            c["schedule"],
            c["raster"],
            c["swizzle"],
        )


@needs_kernels
def test_split_k_needs_eight_k_tiles():
    few = autotuner.candidates(4096, 4096, 256, dtype=jnp.bfloat16, device=H200)
    assert few[-1] == {"path": "xla"} and len(few) > 1
    assert not [c for c in few if c.get("schedule") == "split_k"]


def test_without_a_kernel_family_only_xla_is_a_candidate():
    cpu = DeviceInfo("cpu")
    assert autotuner.candidates(*BIG, dtype=jnp.bfloat16, device=cpu) == [{"path": "xla"}]
    old = dataclasses.replace(H200, compute_capability=(8, 0))
    assert autotuner.candidates(*BIG, dtype=jnp.bfloat16, device=old) == [{"path": "xla"}]


# --------------------------------------------------------------------------- autotune()


def test_autotune_needs_a_present_cuda_gpu(cache_dir):
    with pytest.raises(RuntimeError, match="present GPU"):
        jax_cluster.autotune([(128, 128, 128)], device=H200)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        jax_cluster.autotune([(128, 128, 128)], device=jax.devices("cpu")[0])
    with pytest.raises(ValueError, match="m, n, k"):
        jax_cluster.autotune([(128, 128)])
    assert not (cache_dir / "autotune.json").exists()


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="an accelerator is present")
def test_autotune_without_a_gpu_says_so():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        jax_cluster.autotune([(128, 128, 128)], progress=False)


@needs_kernels
def test_tuning_loop_on_the_cpu_with_h200_candidates(cache_dir, monkeypatch):
    # On the CPU the kernel plans lower to XLA's dot, so every candidate runs:
    # this checks the loop, the failure record, the winner and the file, not speed.
    monkeypatch.setattr(autotuner, "_present_gpu", lambda device: (jax.devices("cpu")[0], H200))
    monkeypatch.setattr(autotuner.timing, "cupti_works", lambda x: False)  # the wall-clock path
    real = autotuner.candidates
    monkeypatch.setattr(autotuner, "candidates", lambda *a, **kw: [{"variant": "no_such_variant"}] + real(*a, **kw))
    results = jax_cluster.autotune([(128, 256, 128), (64, 64, 64, 2)], progress=False, iters=1)
    assert set(results) == {(128, 256, 128), (64, 64, 64, 2)}
    for r in results.values():
        assert r.timer == "wall" and r.ms > 0 and r.xla_ms > 0
        assert [t.overrides for t in r.failed] == [{"variant": "no_such_variant"}]
        assert "ValueError" in r.failed[0].error
        assert r.ms == min(t.ms for t in r.timings if t.ms is not None)
        assert r.runner_up is not None and r.runner_up_ms >= r.ms
        entry = json.loads((cache_dir / "autotune.json").read_text())["entries"][r.key]
        assert entry["overrides"] == r.overrides and entry["ms"] == r.ms
        assert entry["xla_ms"] == r.xla_ms and entry["runner_up"] == r.runner_up
        assert entry["timer"] == "wall" and entry["jax_cluster"] == jax_cluster.__version__
        assert entry["failed"] == 1 and entry["candidates"] == len(r.timings) and entry["date"]
    assert "batch 2" in results[(64, 64, 64, 2)].key


def test_cache_false_writes_nothing(cache_dir, monkeypatch):
    monkeypatch.setattr(autotuner, "_present_gpu", lambda device: (jax.devices("cpu")[0], H200))
    monkeypatch.setattr(autotuner.timing, "cupti_works", lambda x: False)
    r = jax_cluster.autotune([(64, 64, 64)], cache=False, progress=False, iters=1)[(64, 64, 64)]
    assert r.overrides is not None and r.cache_file is None
    assert not (cache_dir / "autotune.json").exists()


def test_text_progress_bar_draws_one_line():
    out = io.StringIO()
    bar = TextBar(4, stream=out, width=8)
    bar.set_description("4096x4096x4096x1 XLA dot")
    bar.update(2)
    bar.close()
    last = out.getvalue().split("\r")[-1]
    assert last.startswith("[####....] 2/4 4096x4096x4096x1 XLA dot") and last.endswith("\n")
    quiet = progress_bar(3, enabled=False)
    quiet.update(1), quiet.set_description("x"), quiet.close()  # draws nothing, raises nothing
