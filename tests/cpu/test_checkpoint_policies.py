"""jax_cluster.checkpoint_policies: under them a jax_cluster product's output
is saved where JAX's policy of the same name saves a dot_general's, so a
rematerialized step runs as many GEMMs as the same step written with jnp
(counted in the gradient's jaxpr), and computes the same gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import rel_error

import jax_cluster
from jax_cluster import checkpoint_policies
from jax_cluster import nn as jcnn

PRODUCTS = ("dot_general[", "jax_cluster_gemm[", "jax_cluster_gemm_epilogue[", "jax_cluster_ragged_dot[")
POLICIES = ["dots_saveable", "dots_with_no_batch_dims_saveable"]


def products_in(f, *args):
    text = str(jax.make_jaxpr(f)(*args))
    return sum(text.count(p) for p in PRODUCTS)


def mlp(matmul):
    return lambda x, w1, w2: matmul(jax.nn.gelu(matmul(x, w1)), w2).astype(jnp.float32).sum()


def operands(*shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.standard_normal(s), jnp.float32) for s in shapes]


@pytest.mark.parametrize("name", POLICIES)
def test_jax_policies_recompute_what_ours_save(name):
    """The reason for the module: JAX's policy recomputes the first product."""
    args = operands((64, 32), (32, 128), (128, 32))
    grad = lambda f, policy: jax.grad(jax.checkpoint(f, policy=policy), argnums=(0, 1, 2))  # noqa: E731
    theirs = products_in(grad(mlp(jnp.matmul), getattr(jax.checkpoint_policies, name)), *args)
    assert theirs == 6  # two forward, four backward
    assert products_in(grad(mlp(jax_cluster.matmul), getattr(jax.checkpoint_policies, name)), *args) == theirs + 1
    ours = grad(mlp(jax_cluster.matmul), getattr(checkpoint_policies, name))
    assert products_in(ours, *args) == theirs
    plain = jax.grad(mlp(jax_cluster.matmul), argnums=(0, 1, 2))(*args)
    for got, want in zip(ours(*args), plain):
        assert rel_error(got, want) < 1e-6


def test_batched_products_are_recomputed_under_the_no_batch_policy():
    args = operands((4, 64, 32), (4, 32, 128), (4, 128, 32))
    sides = [
        (jnp.matmul, jax.checkpoint_policies.dots_with_no_batch_dims_saveable),
        (jax_cluster.matmul, checkpoint_policies.dots_with_no_batch_dims_saveable),
    ]
    counts = [products_in(jax.grad(jax.checkpoint(mlp(mm), policy=p), argnums=(0, 1, 2)), *args) for mm, p in sides]
    assert counts[0] == counts[1] == 7


@pytest.mark.parametrize("name", POLICIES)
def test_grouped_products_are_saved(name):
    x, w1, w2 = operands((96, 32), (4, 32, 64), (4, 64, 32))
    sizes = jnp.array([30, 0, 40, 26], jnp.int32)

    def moe(x, w1, w2):
        h = jax.nn.gelu(jax_cluster.ragged_dot(x, w1, sizes))
        return jax_cluster.ragged_dot(h, w2, sizes).sum()

    remat = jax.grad(jax.checkpoint(moe, policy=getattr(checkpoint_policies, name)), argnums=(0, 1, 2))
    assert products_in(remat, x, w1, w2) == products_in(jax.grad(moe, argnums=(0, 1, 2)), x, w1, w2) == 6


@pytest.mark.parametrize("activation", ["gelu", "none"])
def test_layers_under_remat_run_flax_s_products(activation):
    """jax_cluster's Linear (a custom JVP around the products; without an
    activation, the fused kernel) under the policy runs the GEMMs Flax's
    Linear runs under JAX's."""
    x = jnp.ones((64, 32), jnp.bfloat16)

    def count(cls, policy, **kw):
        first = cls(32, 128, dtype=jnp.bfloat16, rngs=nnx.Rngs(0), **kw)
        second = cls(128, 32, dtype=jnp.bfloat16, rngs=nnx.Rngs(1))
        act = jax.nn.gelu if cls is nnx.Linear and activation == "gelu" else (lambda h: h)
        (g1, p1), (g2, p2) = nnx.split(first), nnx.split(second)

        def loss(p1, p2, x):
            return nnx.merge(g2, p2)(act(nnx.merge(g1, p1)(x))).astype(jnp.float32).sum()

        return products_in(jax.grad(jax.checkpoint(loss, policy=policy), argnums=(0, 1, 2)), p1, p2, x)

    flax = count(nnx.Linear, jax.checkpoint_policies.dots_saveable)
    assert count(jcnn.Linear, checkpoint_policies.dots_saveable, activation=activation) == flax == 6
