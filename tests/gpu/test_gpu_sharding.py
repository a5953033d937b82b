"""Partitioning on real GPUs (a machine with two or more): every shard runs
the kernel (its custom call is in the compiled program), the output keeps
its sharding, no operand is gathered whole, and the numbers match a float64
reference. The CPU tests in test_sharding.py cover the same rules on 8 host
devices; this file proves them where the kernels run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import compiled_text, put, ragged_reference, randn, reference, rel_error
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_cluster
from jax_cluster.planning.tables import FFI_TARGETS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(len(jax.devices()) < 2 or jax.devices()[0].platform != "gpu", reason="needs two GPUs"),
]

BF16 = jnp.bfloat16


@pytest.fixture
def mesh():
    return jax.make_mesh((len(jax.devices()),), ("x",), axis_types=(AxisType.Auto,))


# a [M,K] spec, b [K,N] spec, output spec, all-reduce expected
MATMUL_CASES = {
    "m": (P("x", None), P(), P("x", None), False),
    "n": (P(), P(None, "x"), P(None, "x"), False),
    "k": (P(None, "x"), P("x", None), P(), True),
}


@pytest.mark.parametrize("case", MATMUL_CASES)
def test_matmul_runs_the_kernel_on_every_shard(mesh, case):
    sa, sb, so, reduces = MATMUL_CASES[case]
    a, b = randn((2048, 4096), BF16), randn((4096, 1536), BF16)
    A, B = put(mesh, a, sa), put(mesh, b, sb)
    f = jax.jit(jax_cluster.matmul)
    out = f(A, B)
    assert out.sharding.is_equivalent_to(NamedSharding(mesh, so), 2)
    assert rel_error(out, reference(a, b)) < 1e-2
    text = compiled_text(f, A, B)
    assert FFI_TARGETS["gemm"] in text and "all-gather" not in text
    assert ("all-reduce" in text) == reduces


# x, w, bias, output (and residual) specs
@pytest.mark.parametrize(
    "spec", [(P("x", None), P(), P(), P("x", None)), (P(), P(None, "x"), P("x"), P(None, "x"))], ids=["m", "n"]
)
def test_fused_linear_runs_per_shard(mesh, spec):
    sx, sw, sbias, so = spec
    x, w = randn((1024, 2048), BF16), randn((2048, 1024), BF16)
    bias, res = randn((1024,), BF16), randn((1024, 1024), BF16)
    args = (put(mesh, x, sx), put(mesh, w, sw), put(mesh, bias, sbias), put(mesh, res, so))
    f = jax.jit(lambda x, w, b, r: jax_cluster.linear(x, w, b, residual=r, activation="gelu"))
    out = f(*args)
    assert out.sharding.is_equivalent_to(NamedSharding(mesh, so), 2)
    ref = jax.nn.gelu(reference(x, w) + np.asarray(bias, np.float64) + np.asarray(res, np.float64))
    assert rel_error(out, ref) < 1e-2
    text = compiled_text(f, *args)
    assert FFI_TARGETS["gemm_epilogue"] in text and "all-gather" not in text


def test_ragged_dot_token_sharded(mesh):
    shards, rows, groups = len(jax.devices()), 2048, 8
    lhs, rhs = randn((shards * rows, 1024), BF16), randn((groups, 1024, 768), BF16)
    rng = np.random.default_rng()
    cuts = np.sort(rng.integers(0, rows + 1, size=(shards, groups)), axis=1)
    sizes = np.diff(cuts, axis=1, prepend=0).astype(np.int32)  # rows left over per shard
    L, S = put(mesh, lhs, P("x")), put(mesh, jnp.asarray(sizes), P("x"))
    f = jax.jit(jax_cluster.ragged_dot)
    out = f(L, rhs, S)
    assert out.sharding.is_equivalent_to(NamedSharding(mesh, P("x")), 2)
    lhs_host = np.asarray(lhs.astype(jnp.float32))
    ref = np.concatenate([ragged_reference(lhs_host[s * rows : (s + 1) * rows], rhs, sizes[s]) for s in range(shards)])
    assert rel_error(out, ref) < 1e-2
    text = compiled_text(f, L, rhs, S)
    assert FFI_TARGETS["ragged_dot"] in text and "all-gather" not in text


def test_data_parallel_linear_grads_reduce_only_the_weights(mesh):
    x, w, b = randn((4096, 1024), BF16), randn((1024, 2048), BF16), randn((2048,), BF16)
    X = put(mesh, x, P("x"))

    def loss(x, w, b):
        return jnp.sum(jax_cluster.linear(x, w, b, activation="silu").astype(jnp.float32) ** 2)

    f = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    dx, dw, db = f(X, w, b)
    assert dx.sharding.is_equivalent_to(NamedSharding(mesh, P("x")), 2)
    f32 = lambda t: t.astype(jnp.float32)  # noqa: E731
    want = jax.jit(
        jax.grad(
            lambda x, w, b: jnp.sum(jax.nn.silu(jnp.matmul(x, w, precision="highest") + b) ** 2), argnums=(0, 1, 2)
        )
    )(f32(x), f32(w), f32(b))
    for got, ref in zip((dx, dw, db), want):
        assert rel_error(got, ref) < 2e-2
    text = compiled_text(f, X, w, b)
    assert FFI_TARGETS["gemm"] in text and "all-gather" not in text and "all-reduce" in text


@pytest.mark.parametrize("layer", ["dense", "grouped"])
def test_the_fp8_recipe_trains_data_parallel_on_the_kernels(mesh, layer):
    """fp8 training with the tokens split across GPUs: every shard runs the
    block-scaled kernels on its own rows (and, grouped, its own [S, G]
    blocks), nothing is gathered, and the gradients match the one-device step."""
    from jax_cluster.ops.fp8_training import fp8_grouped, fp8_linear

    devices = len(jax.devices())
    if layer == "dense":
        x, w = randn((2048 * devices, 1024), BF16), randn((1024, 2048), BF16) * 0.05
        args, specs, step = (x, w), (P("x"), P()), fp8_linear
        target = FFI_TARGETS["scaled_gemm"]
    else:
        rows, groups = 1024, 8
        x, w = randn((rows * devices, 1024), BF16), randn((groups, 1024, 1536), BF16) * 0.05
        cuts = np.sort(np.random.default_rng(devices).integers(0, rows + 1, (devices, groups)), axis=1)
        sizes = jnp.asarray(np.diff(cuts, axis=1, prepend=0), jnp.int32)
        args, specs, step = (x, w, sizes), (P("x"), P(), P("x")), fp8_grouped
        target = FFI_TARGETS["scaled_ragged_dot"]
    f = jax.jit(jax.grad(lambda *a: jnp.sum(step(*a).astype(jnp.float32) ** 2), argnums=(0, 1)))
    placed = [put(mesh, a, s) for a, s in zip(args, specs)]
    text = compiled_text(f, *placed)
    assert target in text and "all-gather" not in text and "all-reduce" in text
    for got, want in zip(f(*placed), f(*args)):
        assert rel_error(got, want) < 1e-2  # the same fp8 products, summed in another order
