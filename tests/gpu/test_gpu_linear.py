"""The fused-epilogue kernels ("bias_act" rows) on a real GPU: every
activation, bias and residual present or absent, both kernel layouts, the
stream-K and split-K fix-ups, gradients, and bad calls returning ffi::Error.
Outputs are NaN-poisoned before each launch (conftest)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import linear_reference, randn, rel_error, tolerance

import jax_cluster
from jax_cluster import _ffi
from jax_cluster.planning.tables import ACTIVATIONS, FFI_TARGETS
from jax_cluster.primitives.epilogue import gemm_epilogue

pytestmark = pytest.mark.gpu


def _plan(m, n, k, layout="kn", **overrides):
    p = jax_cluster.plan(
        m, n, k, dtype=jnp.bfloat16, b_major="n" if layout == "kn" else "k", epilogue="bias_act", **overrides
    )
    assert p.path == "kernel" and p.variant.endswith("_bias_act"), p.reason
    return p


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_every_activation_on_the_kernel(activation, layout):
    m, n, k = 1000, 1016, 520
    x = randn((m, k), jnp.bfloat16)
    w = randn((k, n) if layout == "kn" else (n, k), jnp.bfloat16)
    b, r = randn((n,), jnp.bfloat16), randn((m, n), jnp.bfloat16)
    plan = _plan(m, n, k, layout)
    out = jax.jit(
        lambda x, w, b, r: gemm_epilogue(
            x, w, b, r, b_major=plan.b_major, alpha=0.5, beta=2.0, activation=activation, plan=plan
        )
    )(x, w, b, r)
    ref = linear_reference(x, w, b, r, activation=activation, alpha=0.5, beta=2.0, layout=layout)
    assert np.isfinite(np.asarray(out, np.float32)).all()
    assert rel_error(out, ref) < tolerance(jnp.bfloat16)


@pytest.mark.parametrize("with_bias,with_residual", [(False, False), (True, False), (False, True)])
def test_absent_operands_on_the_kernel(with_bias, with_residual):
    m, n, k = 256, 512, 384
    x, w = randn((m, k), jnp.bfloat16), randn((k, n), jnp.bfloat16)
    b = randn((n,), jnp.bfloat16) if with_bias else None
    r = randn((m, n), jnp.bfloat16) if with_residual else None
    plan = _plan(m, n, k)
    out = gemm_epilogue(x, w, b, r, beta=1.0 if with_residual else 0.0, activation="silu", plan=plan)
    assert rel_error(out, linear_reference(x, w, b, r, activation="silu")) < tolerance(jnp.bfloat16)


@pytest.mark.parametrize("schedule,extra", [("stream_k", {}), ("split_k", {"splits": 3})])
def test_fixup_schedules_apply_the_epilogue_once(schedule, extra):
    m, n, k = 512, 512, 8192
    x, w = randn((m, k), jnp.bfloat16), randn((k, n), jnp.bfloat16)
    b, r = randn((n,), jnp.bfloat16), randn((m, n), jnp.bfloat16)
    plan = _plan(m, n, k, schedule=schedule, **extra)
    out = gemm_epilogue(x, w, b, r, beta=1.0, activation="gelu", plan=plan)
    assert rel_error(out, linear_reference(x, w, b, r, activation="gelu")) < tolerance(jnp.bfloat16)


def test_layer_gradients_on_the_kernel():
    x, w = randn((512, 256), jnp.bfloat16), randn((256, 384), jnp.bfloat16)
    b, r = randn((384,), jnp.bfloat16), randn((512, 384), jnp.bfloat16)
    loss = lambda f: lambda *a: jnp.sum(f(*a).astype(jnp.float32) ** 2)  # noqa: E731
    ours = jax.jit(
        jax.grad(
            loss(lambda x, w, b, r: jax_cluster.linear(x, w, b, residual=r, activation="gelu")), argnums=(0, 1, 2, 3)
        )
    )(x, w, b, r)
    theirs = jax.grad(loss(lambda x, w, b, r: linear_reference(x, w, b, r, activation="gelu")), argnums=(0, 1, 2, 3))(
        x, w, b, r
    )
    for got, want in zip(ours, theirs):
        assert rel_error(got, want) < 2e-2  # bf16 pre-activation and bf16 GEMM inputs


def test_repeats_are_bit_identical():
    x, w, b = randn((1024, 512), jnp.bfloat16), randn((512, 1024), jnp.bfloat16), randn((1024,), jnp.bfloat16)
    f = jax.jit(lambda x, w, b: jax_cluster.linear(x, w, b, activation="relu"))
    first = np.asarray(f(x, w, b)).view(np.uint16)
    for _ in range(5):
        assert np.array_equal(np.asarray(f(x, w, b)).view(np.uint16), first)


def _raw_call(plan, a, b, bias, c, *, alpha=1.0, beta=0.0, activation=0, ws=1 << 20):
    _ffi.register_targets()
    call = jax.ffi.ffi_call(
        FFI_TARGETS["gemm_epilogue"],
        (jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), jnp.bfloat16), jax.ShapeDtypeStruct((ws,), jnp.uint8)),
    )
    return call(
        a,
        b,
        bias,
        c,
        plan=plan.ffi_attrs(),
        alpha=np.float32(alpha),
        beta=np.float32(beta),
        activation=np.int32(activation),
    )[0]


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(activation=9), "activation must be"),
        (dict(bias=(100,)), "bias must be"),
        (dict(c=(128, 256)), "C must have the result's shape"),
        (dict(beta=1.0), "beta is not 0 but C is missing"),
        (dict(plain_plan=True), "has epilogue 'none'"),
    ],
)
def test_bad_epilogue_calls_return_ffi_errors(change, message):
    a, b = randn((256, 256), jnp.bfloat16), randn((256, 256), jnp.bfloat16)
    bias = randn(change.get("bias", (256,)), jnp.bfloat16)
    c = randn(change["c"], jnp.bfloat16) if "c" in change else jnp.zeros((0,), jnp.bfloat16)
    plan = jax_cluster.plan(256, 256, 256, dtype=jnp.bfloat16) if change.get("plain_plan") else _plan(256, 256, 256)
    kw = {key: change[key] for key in ("activation", "beta") if key in change}
    with pytest.raises(Exception, match=message):
        jax.block_until_ready(_raw_call(plan, a, b, bias, c, **kw))


def test_plain_handler_refuses_a_fused_variant():
    _ffi.register_targets()
    plan = _plan(256, 256, 256)
    call = jax.ffi.ffi_call(
        FFI_TARGETS["gemm"],
        (jax.ShapeDtypeStruct((256, 256), jnp.bfloat16), jax.ShapeDtypeStruct((1 << 20,), jnp.uint8)),
    )
    a, b = randn((256, 256), jnp.bfloat16), randn((256, 256), jnp.bfloat16)
    with pytest.raises(Exception, match="has epilogue 'bias_act'"):
        jax.block_until_ready(call(a, b, plan=dataclasses.replace(plan).ffi_attrs())[0])
