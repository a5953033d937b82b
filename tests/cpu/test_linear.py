"""jax_cluster.linear: act(alpha * x @ W + beta * residual + bias), on the
fallback here (the fused kernel's lowering is checked in test_export_linear,
its numbers in test_gpu_linear)."""

import jax
import jax.numpy as jnp
import pytest
from helpers import linear_reference, randn, rel_error, tolerance

import jax_cluster

ACTIVATIONS = ["none", "relu", "gelu", "gelu_exact", "silu"]


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_matches_float32_reference(activation, layout):
    x, w = randn((3, 40, 64), jnp.bfloat16), randn((64, 48) if layout == "kn" else (48, 64), jnp.bfloat16)
    bias, res = randn((48,), jnp.bfloat16), randn((3, 40, 48), jnp.bfloat16)
    f = jax.jit(
        lambda *a: jax_cluster.linear(
            *a[:3], residual=a[3], activation=activation, alpha=0.5, beta=2.0, kernel_layout=layout
        )
    )
    out = f(x, w, bias, res)
    assert out.shape == (3, 40, 48) and out.dtype == jnp.bfloat16
    ref = linear_reference(x, w, bias, res, activation=activation, alpha=0.5, beta=2.0, layout=layout)
    assert rel_error(out, ref) < tolerance(jnp.bfloat16)


@pytest.mark.parametrize("with_bias,with_residual", [(False, False), (True, False), (False, True)])
def test_optional_operands(with_bias, with_residual):
    x, w = randn((16, 32), jnp.float16), randn((32, 24), jnp.float16)
    bias = randn((24,), jnp.float16) if with_bias else None
    res = randn((16, 24), jnp.float16) if with_residual else None
    out = jax_cluster.linear(x, w, bias, residual=res, activation="relu")
    assert rel_error(out, linear_reference(x, w, bias, res, activation="relu")) < tolerance(jnp.float16)


def test_f32_output_from_bf16():
    x, w, b = randn((8, 16), jnp.bfloat16), randn((16, 8), jnp.bfloat16), randn((8,), jnp.float32)
    out = jax_cluster.linear(x, w, b, activation="silu", out_dtype=jnp.float32)
    assert out.dtype == jnp.float32
    assert rel_error(out, linear_reference(x, w, b.astype(jnp.float32), activation="silu")) < 1e-5


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_gradients_match_the_reference(activation):
    x, w, b, r = (randn(s, jnp.float32) for s in ((4, 5, 16), (16, 12), (12,), (4, 5, 12)))

    def loss(fn):
        return lambda *a: jnp.sum(jnp.sin(fn(*a)))

    ours = jax.grad(
        loss(lambda x, w, b, r: jax_cluster.linear(x, w, b, residual=r, activation=activation, alpha=0.7, beta=1.5)),
        argnums=(0, 1, 2, 3),
    )
    theirs = jax.grad(
        loss(lambda x, w, b, r: linear_reference(x, w, b, r, activation=activation, alpha=0.7, beta=1.5)),
        argnums=(0, 1, 2, 3),
    )
    for got, want in zip(ours(x, w, b, r), theirs(x, w, b, r)):
        assert rel_error(got, want) < 1e-5


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_forward_mode_matches_the_reference(activation):
    """jax.jvp, jax.jacfwd and jax.linearize work as on Flax's layer, with
    some operands held constant (their tangents are symbolic zeros)."""
    x, w, b, r = (randn(s, jnp.float32) for s in ((4, 5, 16), (16, 12), (12,), (4, 5, 12)))

    def ours(x, w, b, r):
        return jax_cluster.linear(x, w, b, residual=r, activation=activation, alpha=0.7, beta=1.5)

    def theirs(x, w, b, r):
        return linear_reference(x, w, b, r, activation=activation, alpha=0.7, beta=1.5)

    tangents = tuple(randn(t.shape, jnp.float32) for t in (x, w, b, r))
    for got, want in zip(jax.jvp(ours, (x, w, b, r), tangents), jax.jvp(theirs, (x, w, b, r), tangents)):
        assert rel_error(got, want) < 1e-5
    only_w = jax.jvp(lambda w: ours(x, w, b, r), (w,), (tangents[1],))[1]
    assert rel_error(only_w, jax.jvp(lambda w: theirs(x, w, b, r), (w,), (tangents[1],))[1]) < 1e-5
    assert rel_error(jax.jacfwd(ours, argnums=2)(x, w, b, r), jax.jacfwd(theirs, argnums=2)(x, w, b, r)) < 1e-5
    _, tangent_of = jax.linearize(lambda x: ours(x, w, b, r), x)
    assert rel_error(tangent_of(tangents[0]), jax.jvp(lambda x: theirs(x, w, b, r), (x,), (tangents[0],))[1]) < 1e-5


@pytest.mark.parametrize("activation", ["none", "gelu"])
def test_bias_gradient_is_flax_reduce_in_the_output_dtype(activation):
    """The bias gradient is the transpose of the bias broadcast, a bf16 reduce,
    as behind nnx.Linear: no float32 pass of its own (0.0112 ms against 0.0080
    at 2048x8192 on the H200), and the H200 gives Flax's bits."""
    x, w, b = randn((32, 16), jnp.bfloat16), randn((16, 24), jnp.bfloat16), randn((24,), jnp.bfloat16)
    grad = jax.grad(lambda b: jnp.sum(jax_cluster.linear(x, w, b, activation=activation).astype(jnp.float32) ** 2))
    reduces = [
        e
        for e in jax.make_jaxpr(grad)(b).jaxpr.eqns
        if e.primitive.name == "reduce_sum" and e.outvars[0].aval.shape == (24,)
    ]
    assert reduces and all(e.invars[0].aval.dtype == jnp.bfloat16 for e in reduces)
    got = grad(b)
    assert got.dtype == jnp.bfloat16
    want = jax.grad(lambda b: jnp.sum(linear_reference(x, w, b, activation=activation) ** 2))(b)
    # the reduce itself runs in bf16 (as Flax's does), so its sum rounds once per row: two roundings' room
    assert rel_error(got, want) < 2 * tolerance(jnp.bfloat16)


def test_gradient_of_nk_kernel_keeps_its_layout():
    x, w = randn((6, 16), jnp.float32), randn((12, 16), jnp.float32)
    g = jax.grad(lambda w: jax_cluster.linear(x, w, kernel_layout="nk", activation="gelu").sum())(w)
    want = jax.grad(lambda w: linear_reference(x, w, activation="gelu", layout="nk").sum())(w)
    assert g.shape == (12, 16) and rel_error(g, want) < 1e-5


def test_vmap_over_tokens_and_over_weights():
    x, w, b, r = (
        randn((3, 7, 16), jnp.float32),
        randn((16, 8), jnp.float32),
        randn((8,), jnp.float32),
        randn((3, 7, 8), jnp.float32),
    )
    f = lambda x, w, r: jax_cluster.linear(x, w, b, residual=r, activation="gelu")  # noqa: E731
    tokens = jax.vmap(f, in_axes=(0, None, 0))(x, w, r)
    assert rel_error(tokens, linear_reference(x, w, b, r, activation="gelu")) < 1e-5
    ws = randn((3, 16, 8), jnp.float32)
    per_weight = jax.vmap(f, in_axes=(0, 0, 0))(x, ws, r)
    want = jnp.stack([linear_reference(x[i], ws[i], b, r[i], activation="gelu") for i in range(3)])
    assert rel_error(per_weight, want) < 1e-5


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda x, w: jax_cluster.linear(x, w, activation="tanh"), "unknown activation"),
        (lambda x, w: jax_cluster.linear(x, w, jnp.zeros((5,))), "bias must be"),
        (lambda x, w: jax_cluster.linear(x, w, residual=jnp.zeros((4, 5))), "residual must be"),
        (lambda x, w: jax_cluster.linear(x, w, beta=2.0), "no residual"),
        (lambda x, w: jax_cluster.linear(x, w, kernel_layout="kk"), "kernel_layout"),
        (lambda x, w: jax_cluster.linear(x, w.T), "has K="),
        (lambda x, w: jax_cluster.linear(x.astype(jnp.int32), w.astype(jnp.int32)), "unsupported dtype"),
    ],
)
def test_bad_input_raises_at_trace_time(call, message):
    x, w = jnp.ones((4, 16), jnp.bfloat16), jnp.ones((16, 8), jnp.bfloat16)
    with pytest.raises((ValueError, TypeError), match=message):
        jax.jit(call)(x, w)


def test_primitive_refuses_an_unknown_layout():
    from jax_cluster.primitives.epilogue import gemm_epilogue

    with pytest.raises(ValueError, match="b_major must be"):
        gemm_epilogue(jnp.ones((4, 8), jnp.bfloat16), jnp.ones((8, 4), jnp.bfloat16), b_major="x")


def test_plan_for_the_fused_epilogue_picks_only_bias_act_rows():
    from jax_cluster.planning import tables

    names = {v.name for v in tables.load_menu() if v.epilogue == "bias_act"}
    assert names, "the menu has no bias_act row"
    for v in tables.load_menu():
        if v.epilogue == "bias_act":
            assert v.problem == "dense" and v.name.endswith("_bias_act")
    with pytest.raises(ValueError, match="epilogue must be one of"):
        jax_cluster.plan(64, 64, 64, dtype=jnp.bfloat16, epilogue="gelu")
    on_cpu = jax_cluster.plan(64, 64, 64, dtype=jnp.bfloat16, epilogue="bias_act", device=jax.devices("cpu")[0])
    assert on_cpu.path == "xla" and on_cpu.epilogue == "bias_act"
