"""The tools on a GPU: the self-test of every compiled variant of its
architecture, and autotune of one small shape, whose winner the planner then uses."""

import json

import jax
import jax.numpy as jnp
import pytest
from helpers import randn, reference, rel_error, tolerance

import jax_cluster
from jax_cluster.planning.device import describe
from jax_cluster.tools import selftest
from jax_cluster.tuning import autotuner

pytestmark = pytest.mark.gpu


def test_selftest_passes_on_the_gpu(capsys):
    assert selftest.main(["--quick"]) == 0, capsys.readouterr().out


def test_autotune_on_the_gpu_writes_a_winner_the_planner_uses(gpu, autotune_cache_dir):
    shape = (256, 512, 1024)
    r = jax_cluster.autotune([shape], device=gpu, progress=False, iters=3)[shape]
    assert not r.failed, [(t.overrides, t.error) for t in r.failed]
    assert r.overrides in autotuner.candidates(*shape, dtype=jnp.bfloat16, device=gpu)
    assert r.ms > 0 and r.xla_ms > 0 and r.timer in ("cupti", "wall")
    dev = describe(gpu)
    assert dev.name in r.key and f"{dev.sm_count}SMs" in r.key
    entry = json.loads((autotune_cache_dir / "autotune.json").read_text())["entries"][r.key]
    assert entry["overrides"] == r.overrides and entry["timer"] == r.timer

    jax_cluster.use_autotune_cache(True)
    p = jax_cluster.plan(*shape, dtype=jnp.bfloat16, device=gpu)
    assert [note for note in p.notes if "autotune cache" in note]
    m, n, k = shape
    a, b = randn((m, k), jnp.bfloat16), randn((k, n), jnp.bfloat16)
    # a function of its own: jit would reuse an earlier trace of matmul itself,
    # planned before the cache was on
    out = jax.jit(lambda a, b: jax_cluster.matmul(a, b))(a, b)
    assert rel_error(out, reference(a, b)) < tolerance(jnp.bfloat16)
