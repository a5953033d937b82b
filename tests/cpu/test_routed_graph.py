"""Where the routing sends a dense call to XLA, jax_cluster's layer lowers
(for CUDA, checked without a GPU) to the graph behind the Flax layer it
replaces: the same dots in the same dtype and the same elementwise work, so
XLA fuses both alike and a routed layer costs what Flax's costs."""

import collections
import re

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax import export

from jax_cluster import nn as jcnn
from jax_cluster.planning import device, routing
from jax_cluster.planning.device import DeviceInfo

H200 = DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132, 232448, 50 << 20)


@pytest.fixture(autouse=True)
def routed_on_h200(monkeypatch):
    """Plans made inside the traced function see an H200, not this CPU, and
    route as users' calls do (its table sends these calls to XLA's dot)."""
    monkeypatch.setattr(device, "_describe_present", lambda _: H200)
    monkeypatch.setenv(routing.ROUTE_ENV, "measured")


def cuda_text(f, *args):
    return export.export(jax.jit(f), platforms=("cuda",))(*args).mlir_module()


def ops(text):
    """stablehlo ops by count, without the ones that only reshape (bitcasts on a GPU)."""
    counts = collections.Counter(re.findall(r"stablehlo\.(\w+)", text))
    for reshaping in ("reshape", "broadcast_in_dim"):
        counts.pop(reshaping, None)
    return counts


def dot_dtypes(text):
    return sorted(re.findall(r"stablehlo\.dot_general .*-> tensor<(?:\d+x)*(\w+)>", text))


ACTIVATIONS = {"none": lambda y: y, "gelu": jax.nn.gelu, "relu": jax.nn.relu}


def layers(activation):
    """jax_cluster's Linear and Flax's with the activation after it, on the
    same parameters: (module, how to call it) for each."""
    ours = jcnn.Linear(64, 128, activation=activation, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    theirs = nnx.Linear(64, 128, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    return (ours, lambda m, x: m(x)), (theirs, lambda m, x: ACTIVATIONS[activation](m(x)))


@pytest.mark.parametrize("activation", ["none", "gelu", "relu"])
def test_forward_is_flax_graph(activation):
    x = jnp.ones((4, 128, 64), jnp.bfloat16)
    mine, flax = (cuda_text(lambda x, m=m, call=call: call(m, x), x) for m, call in layers(activation))
    assert "custom_call" not in mine
    assert dot_dtypes(mine) == dot_dtypes(flax) == ["bf16"]
    assert ops(mine) == ops(flax)


@pytest.mark.parametrize("activation", ["none", "gelu"])
def test_gradient_dots_are_flax_dots(activation):
    """Training: the same three products in bf16 (the elementwise ops are
    Flax's up to a reduce over a unit axis, which XLA folds)."""
    x = jnp.ones((512, 64), jnp.bfloat16)

    def grad_text(module, call):
        graph, params = nnx.split(module)

        def loss(p, x):
            return (call(nnx.merge(graph, p), x).astype(jnp.float32) ** 2).sum()

        return cuda_text(jax.grad(loss, argnums=(0, 1)), params, x)

    mine, flax = (grad_text(*side) for side in layers(activation))
    assert "custom_call" not in mine
    assert dot_dtypes(mine) == dot_dtypes(flax) == ["bf16"] * 3  # y, dx and dW
