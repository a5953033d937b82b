"""The sm90a/sm100f kernels on a real GPU, against a float32 reference.

Outputs are poisoned with NaN before every launch (conftest), inputs are
fresh random draws, and kernel results must repeat bit for bit.
"""

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import fresh_key, randn, tolerance
from jax import lax

import jax_cluster
from jax_cluster import _ffi
from jax_cluster.planning.tables import FFI_TARGETS
from jax_cluster.primitives.gemm import gemm

pytestmark = pytest.mark.gpu

SIZES = (1, 7, 64, 129, 1000, 4096, 8192)
DTYPES = [
    (jnp.bfloat16, jnp.bfloat16),
    (jnp.bfloat16, jnp.float32),
    (jnp.float16, jnp.float16),
    (jnp.float16, jnp.float32),
]


@functools.partial(jax.jit, static_argnames=("shape_a", "shape_b", "dtype", "a_major", "b_major", "out_dtype", "plan"))
def _case(key, *, shape_a, shape_b, dtype, a_major, b_major, out_dtype, plan):
    ka, kb = jax.random.split(key)
    a = jax.random.normal(ka, shape_a, jnp.float32).astype(dtype)
    b = jax.random.normal(kb, shape_b, jnp.float32).astype(dtype)
    out = gemm(a, b, a_major=a_major, b_major=b_major, out_dtype=out_dtype, plan=plan)
    ca = 1 if a_major == "k" else 0
    cb = 1 if b_major == "k" else 0
    ref = lax.dot_general(
        a.astype(jnp.float32), b.astype(jnp.float32), (((ca,), (cb,)), ((), ())), precision=lax.Precision.HIGHEST
    )
    o = out.astype(jnp.float32)
    err = jnp.linalg.norm(o - ref) / jnp.maximum(jnp.linalg.norm(ref), 1e-30)
    return err, jnp.isfinite(o).all(), out


def _bits(x):
    x = np.asarray(x)
    return x.view(np.uint16 if x.dtype.itemsize == 2 else np.uint32)


def _assert_batched_matches(run, a, b, spec):
    """run(a, b) twice: every element written (outputs are poisoned), close to
    the float32 einsum `spec`, and bit-identical both times."""
    out, out2 = run(a, b), run(a, b)
    ref = jnp.einsum(spec, a.astype(jnp.float32), b.astype(jnp.float32), precision=lax.Precision.HIGHEST)
    o = out.astype(jnp.float32)
    assert bool(jnp.isfinite(o).all())
    assert float(jnp.linalg.norm(o - ref) / jnp.linalg.norm(ref)) < tolerance(jnp.bfloat16)
    assert np.array_equal(_bits(out), _bits(out2)), "not deterministic"


COMBOS = [(dtype, out, b_major) for dtype, out in DTYPES for b_major in ("n", "k")]


def _grid_shape(m, n, k):
    """One executable for a shape: every dtype and B layout, each kernel run
    twice (behind an optimization barrier, so XLA cannot merge the two), and
    the errors and bit-equality computed on the device."""

    def f(key):
        ka, kb = jax.random.split(key)
        a32 = jax.random.normal(ka, (m, k), jnp.float32)
        b32 = jax.random.normal(kb, (k, n), jnp.float32)
        errs, same = [], []
        for dtype, out_dtype, b_major in COMBOS:
            # the barrier keeps XLA (excess precision allowed) from eliding the rounding
            a, b = lax.optimization_barrier((a32.astype(dtype), b32.astype(dtype)))
            ref = jnp.dot(a.astype(jnp.float32), b.astype(jnp.float32), precision=lax.Precision.HIGHEST)
            if b_major == "k":
                b = b.T
            run = functools.partial(gemm, b_major=b_major, out_dtype=out_dtype)
            out = run(a, b)
            again = run(*lax.optimization_barrier((a, b)))
            o = out.astype(jnp.float32)
            err = jnp.linalg.norm(o - ref) / jnp.maximum(jnp.linalg.norm(ref), 1e-30)
            errs.append(jnp.where(jnp.isfinite(o).all(), err, jnp.nan))
            same.append(
                jnp.array_equal(
                    lax.bitcast_convert_type(out, jnp.uint16 if out.dtype.itemsize == 2 else jnp.uint32),
                    lax.bitcast_convert_type(again, jnp.uint16 if again.dtype.itemsize == 2 else jnp.uint32),
                )
            )
        return jnp.stack(errs), jnp.stack(same)

    return jax.jit(f).lower(jax.random.key(0)).compile()


def test_size_grid():
    shapes = list(itertools.product(SIZES, repeat=3))
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:  # XLA compiles outside the GIL
        compiled = list(pool.map(lambda s: _grid_shape(*s), shapes))
    failures, kernel_cases = [], 0
    for (m, n, k), exe in zip(shapes, compiled):
        errs, same = jax.device_get(exe(fresh_key()))
        for (dtype, out_dtype, b_major), err, repeat in zip(COMBOS, errs, same):
            plan = jax_cluster.plan(m, n, k, dtype=dtype, out_dtype=out_dtype, b_major=b_major)
            kernel_cases += plan.uses_kernel
            assert plan.uses_kernel or plan.reason
            # bit-equality is the kernel's promise; XLA may fuse two copies of its dot differently
            if not err < tolerance(out_dtype) or (plan.uses_kernel and not repeat):
                failures.append(
                    (
                        m,
                        n,
                        k,
                        jnp.dtype(dtype).name,
                        jnp.dtype(out_dtype).name,
                        b_major,
                        plan.variant or "xla",
                        float(err),
                        bool(repeat),
                    )
                )
    print(
        f"\nsize grid: {len(shapes)} shapes x {len(COMBOS)} dtype/layout combinations, "
        f"{kernel_cases} on the kernel, {len(failures)} failures"
    )
    assert kernel_cases > 0
    assert not failures, "\n".join(map(str, failures[:40]))


@pytest.mark.parametrize("schedule", ["static", "dynamic", "stream_k", "split_k"])
@pytest.mark.parametrize(
    "m,n,k",
    [
        (1536, 1536, 32768),
        (4096, 4096, 4096),
        (128, 8192, 8192),
        (333, 2056, 1000),
        (16, 14336, 4096),
        (64, 4096, 4096),
    ],
)
def test_every_schedule(schedule, m, n, k):
    plan = jax_cluster.plan(
        m, n, k, dtype=jnp.bfloat16, schedule=schedule, **({"splits": 3} if schedule == "split_k" else {})
    )
    assert plan.schedule == schedule
    args = dict(
        shape_a=(m, k), shape_b=(k, n), dtype=jnp.bfloat16, a_major="k", b_major="n", out_dtype=jnp.bfloat16, plan=plan
    )
    key = fresh_key()
    err, finite, out = _case(key, **args)
    _, _, out2 = _case(key, **args)
    assert bool(finite) and float(err) < tolerance(jnp.bfloat16)
    assert np.array_equal(_bits(out), _bits(out2)), "not deterministic"


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize("clusters", ["below", "equal", "above"])
def test_tile_counts_around_resident_clusters(clusters, schedule):
    probe = jax_cluster.plan(4096, 4096, 512, dtype=jnp.bfloat16, schedule=schedule)
    slots = probe.max_active_clusters
    tiles_n = slots + {"below": -1, "equal": 0, "above": 1}[clusters]
    m = probe.tile_m * probe.cluster_m
    n = probe.tile_n * tiles_n
    plan = jax_cluster.plan(m, n, 512, dtype=jnp.bfloat16, variant=probe.variant, schedule=schedule)
    args = dict(
        shape_a=(m, 512),
        shape_b=(512, n),
        dtype=jnp.bfloat16,
        a_major="k",
        b_major="n",
        out_dtype=jnp.bfloat16,
        plan=plan,
    )
    err, finite, _ = _case(fresh_key(), **args)
    assert bool(finite) and float(err) < tolerance(jnp.bfloat16)


@pytest.mark.parametrize("b_major", ["n", "k"])
def test_dynamic_schedule_batched_and_both_layouts(b_major):
    """The work queue walks every batch; each tile is whole, so repeats are bit-identical."""
    batch, m, n, k = 3, 1000, 2056, 1000
    plan = jax_cluster.plan(m, n, k, batch=batch, dtype=jnp.bfloat16, b_major=b_major, schedule="dynamic")
    assert plan.uses_kernel and plan.schedule == "dynamic"
    ka, kb = jax.random.split(fresh_key())
    a = jax.random.normal(ka, (batch, m, k), jnp.float32).astype(jnp.bfloat16)
    b = jax.random.normal(kb, (batch, k, n) if b_major == "n" else (batch, n, k), jnp.float32).astype(jnp.bfloat16)
    run = jax.jit(lambda a, b: gemm(a, b, a_major="k", b_major=b_major, out_dtype=jnp.bfloat16, plan=plan))
    _assert_batched_matches(run, a, b, "bmk,bkn->bmn" if b_major == "n" else "bmk,bnk->bmn")


@pytest.mark.parametrize("raster", ["along_n", "along_m"])
@pytest.mark.parametrize("swizzle", [1, 2, 8])
def test_work_queue_walk_covers_every_tile(raster, swizzle):
    """5 x 7 cluster tiles (2x1 clusters of 128x256) in 2 batches, so swizzle 2
    leaves a narrower last band either way; the walk must still write every
    tile once (the output is poisoned) and repeat bit for bit."""
    batch, m, n, k = 2, 1280 - 72, 1792 - 40, 520
    plan = jax_cluster.plan(
        m,
        n,
        k,
        batch=batch,
        dtype=jnp.bfloat16,
        schedule="dynamic",
        tile=(128, 256, 64),
        cluster=(2, 1),
        raster=raster,
        swizzle=swizzle,
    )
    assert plan.uses_kernel and (plan.raster, plan.swizzle) == (raster, swizzle)
    a, b = randn((batch, m, k), jnp.bfloat16), randn((batch, k, n), jnp.bfloat16)
    run = jax.jit(lambda a, b: gemm(a, b, out_dtype=jnp.bfloat16, plan=plan))
    _assert_batched_matches(run, a, b, "bmk,bkn->bmn")


@pytest.mark.parametrize("b_major", ["n", "k"])
def test_gradients_on_the_kernel(b_major):
    m, n, k = 1024, 768, 512
    a = randn((m, k), jnp.bfloat16)
    b = randn((k, n) if b_major == "n" else (n, k), jnp.bfloat16)
    dims = (((1,), (0 if b_major == "n" else 1,)), ((), ()))
    ct = randn((m, n), jnp.float32)
    f = lambda a, b: (jax_cluster.dot_general(a, b, dims, preferred_element_type=jnp.float32) * ct).sum()
    ga, gb = jax.jit(jax.grad(f, argnums=(0, 1)))(a, b)
    g = jax.grad(lambda a, b: (lax.dot_general(a, b, dims, precision=lax.Precision.HIGHEST) * ct).sum(), argnums=(0, 1))
    ra, rb = g(a.astype(jnp.float32), b.astype(jnp.float32))
    for got, ref in ((ga, ra), (gb, rb)):
        err = float(jnp.linalg.norm(got.astype(jnp.float32) - ref) / jnp.linalg.norm(ref))
        assert err < 2 * tolerance(jnp.bfloat16), err
    hlo = jax.jit(jax.grad(f, argnums=(0, 1))).lower(a, b).as_text()
    assert hlo.count(FFI_TARGETS["gemm"]) >= 2


def test_vmap_on_the_kernel():
    a, b = randn((4, 256, 512), jnp.bfloat16), randn((4, 512, 128), jnp.bfloat16)
    out = jax.jit(jax.vmap(jax_cluster.matmul))(a, b)
    ref = jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32), precision="highest")
    assert float(jnp.linalg.norm(out.astype(jnp.float32) - ref) / jnp.linalg.norm(ref)) < 1e-2
    assert FFI_TARGETS["gemm"] in jax.jit(jax.vmap(jax_cluster.matmul)).lower(a, b).as_text()


def test_repeated_calls_inside_one_jit_are_stable():
    """Several kernel calls and elementwise work in one executable (XLA may
    capture it as a command buffer), run many times."""
    a, b = randn((2048, 1024), jnp.bfloat16), randn((1024, 2048), jnp.bfloat16)

    @jax.jit
    def f(a, b):
        x = jax_cluster.matmul(a, b)
        y = jax_cluster.matmul(jnp.tanh(x), b.T)
        return jax_cluster.matmul(y, b)

    first = np.asarray(f(a, b))
    for _ in range(20):
        assert np.array_equal(_bits(f(a, b)), _bits(first))
    assert np.isfinite(first.astype(np.float32)).all()


def _raw_call(plan_attrs, a, b, out_shape, out_dtype, ws=1 << 20):
    call = jax.ffi.ffi_call(
        FFI_TARGETS["gemm"], (jax.ShapeDtypeStruct(out_shape, out_dtype), jax.ShapeDtypeStruct((ws,), jnp.uint8))
    )
    return call(a, b, plan=plan_attrs)[0]


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(tile_m=96), "plan.tile_m"),  # no row has 96
        (dict(variant="no_such_variant"), "not compiled"),
        (dict(schedule="sometimes"), "plan.schedule"),
        (dict(swizzle=3), "plan.swizzle"),
        (dict(max_active_clusters=100000), "clusters fit"),
        (dict(splits=2), "plan.splits"),
    ],
)
def test_bad_plans_return_ffi_errors(change, message):
    _ffi.register_targets()
    plan = jax_cluster.plan(256, 256, 256, dtype=jnp.bfloat16)
    attrs = dataclasses.replace(plan, **change).ffi_attrs()
    a, b = randn((256, 256), jnp.bfloat16), randn((256, 256), jnp.bfloat16)
    with pytest.raises(Exception, match=message):
        jax.block_until_ready(jax.jit(lambda a, b: _raw_call(attrs, a, b, (256, 256), jnp.bfloat16))(a, b))


@pytest.mark.parametrize(
    "shapes,message",
    [
        (((256, 128), (256, 256), (256, 256)), "contracting dimensions differ"),
        (((256, 256), (256, 256), (128, 256)), "result shape"),
        (((256, 256), (256, 256), (256, 256), jnp.float16), "do not match variant"),
    ],
)
def test_bad_buffers_return_ffi_errors(shapes, message):
    _ffi.register_targets()
    plan = jax_cluster.plan(256, 256, 256, dtype=jnp.bfloat16)
    sa, sb, so = shapes[:3]
    dtype = shapes[3] if len(shapes) > 3 else jnp.bfloat16
    a, b = randn(sa, dtype), randn(sb, dtype)
    with pytest.raises(Exception, match=message):
        jax.block_until_ready(_raw_call(plan.ffi_attrs(), a, b, so, dtype))


def test_too_small_workspace_is_an_error():
    _ffi.register_targets()
    plan = jax_cluster.plan(1536, 1536, 32768, dtype=jnp.bfloat16, schedule="stream_k")
    assert plan.workspace_bytes > 16
    a, b = randn((1536, 32768), jnp.bfloat16), randn((32768, 1536), jnp.bfloat16)
    with pytest.raises(Exception, match="workspace"):
        jax.block_until_ready(_raw_call(plan.ffi_attrs(), a, b, (1536, 1536), jnp.bfloat16, ws=16))


def test_plan_on_the_gpu_is_queried():
    plan = jax_cluster.plan(8192, 8192, 8192, dtype=jnp.bfloat16)
    assert plan.path == "kernel" and plan.residency == "queried" and plan.device.source == "queried"
    assert 0 < plan.max_active_clusters <= plan.sm_count
    text = str(jax_cluster.info())
    assert "kernel" in text
