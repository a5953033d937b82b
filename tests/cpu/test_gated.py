"""jax_cluster.gated_ragged_dot on the fallback path (CPU): act(gate) * up per
group against a float64 reference, the interleaved layout, autodiff, vmap,
the planner's choice and explain(), and errors."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import ragged_reference, randn, rel_error

import jax_cluster
from jax_cluster import _ffi
from jax_cluster.planning import tables
from jax_cluster.planning.device import DeviceInfo
from jax_cluster.primitives.activations import activation_fn

H200 = DeviceInfo("cuda", "described H200", (9, 0), 132, 232448, 50 << 20)
GATED_ROW = "sm90_grouped_gemm_ragged_m_bf16_bf16_kn_128x256x64_c1x1_s4_grouped_dynamic_gated"


def gated_reference(lhs, gate, up, sizes, activation):
    """float64 act(x @ gate_g) * (x @ up_g), rows past the groups zero."""
    g, u = ragged_reference(lhs, gate, sizes), ragged_reference(lhs, up, sizes)
    return np.asarray(activation_fn(activation)(jnp.asarray(g)), np.float64) * u


def test_interleave_alternates_blocks_of_eight_and_inverts():
    gate, up = jnp.arange(16.0).reshape(1, 16), 100 + jnp.arange(16.0).reshape(1, 16)
    both = jax_cluster.interleave_gate_up(gate, up)
    assert both[0, :8].tolist() == gate[0, :8].tolist() and both[0, 8:16].tolist() == up[0, :8].tolist()
    assert both[0, 16:24].tolist() == gate[0, 8:].tolist()
    g, u = jax_cluster.split_gate_up_blocks(both)
    assert (g == gate).all() and (u == up).all()
    assert tables.GATE_BLOCK == 8


@pytest.mark.parametrize("activation", tables.ACTIVATIONS)
@pytest.mark.parametrize("rhs_layout", ["gkn", "gnk"])
def test_matches_float64_reference(activation, rhs_layout):
    sizes = [5, 0, 23, -3, 9]  # an empty and a negative group, rows left over
    m, k, h = 45, 24, 16
    x = randn((m, k), jnp.float32)
    gate, up = randn((5, k, h), jnp.float32), randn((5, k, h), jnp.float32)
    w = jax_cluster.interleave_gate_up(gate, up)
    if rhs_layout == "gnk":
        w = jnp.swapaxes(w, 1, 2)
    ref = gated_reference(x, gate, up, sizes, activation)
    b_major = "n" if rhs_layout == "gkn" else "k"
    # unplanned, and with a gated plan: its primitive (whose fallback here is XLA's)
    for plan in (None, _gated_plan(m, 2 * h, k, 5, jnp.float32, b_major=b_major)):
        out = jax.jit(
            lambda *a, plan=plan: jax_cluster.gated_ragged_dot(
                *a, activation=activation, rhs_layout=rhs_layout, plan=plan
            )
        )(x, w, jnp.asarray(sizes, jnp.int32))
        assert out.shape == (m, h)
        assert rel_error(out, ref) < 1e-5


@pytest.mark.parametrize("planned", [False, True])
def test_bf16_with_any_integer_sizes_and_row_blocks(planned):
    x = randn((64, 32), jnp.bfloat16)
    gate, up = randn((4, 32, 24), jnp.bfloat16), randn((4, 32, 24), jnp.bfloat16)
    w = jax_cluster.interleave_gate_up(gate, up)
    sizes = np.array([[10, 0, 12, 5], [3, 20, 0, 9]])
    plan = _gated_plan(32, 48, 32, 4, jnp.bfloat16, out_dtype=jnp.float32) if planned else None
    out = jax_cluster.gated_ragged_dot(
        x, w, jnp.asarray(sizes, jnp.uint8), preferred_element_type=jnp.float32, plan=plan
    )
    ref = np.concatenate([gated_reference(x[i * 32 : (i + 1) * 32], gate, up, s, "silu") for i, s in enumerate(sizes)])
    assert out.dtype == jnp.float32 and rel_error(out, ref) < 1e-2


def _gated_plan(m, n, k, groups, dtype, **kw):
    return jax_cluster.plan_ragged(m, n, k, groups, problem="ragged_m", dtype=dtype, epilogue="gated", **kw)


def test_gradient_matches_the_separate_products():
    sizes = jnp.asarray([7, 0, 12, 6], jnp.int32)
    x = randn((30, 16), jnp.float32)
    gate, up = randn((4, 16, 8), jnp.float32), randn((4, 16, 8), jnp.float32)
    dy = randn((30, 8), jnp.float32)

    def ours(x, w):
        return (jax_cluster.gated_ragged_dot(x, w, sizes, activation="gelu") * dy).sum()

    def theirs(x, gate, up):
        g, u = jax.lax.ragged_dot(x, gate, sizes), jax.lax.ragged_dot(x, up, sizes)
        return (activation_fn("gelu")(g) * u * dy).sum()

    rx, rg, ru = jax.grad(theirs, argnums=(0, 1, 2))(x, gate, up)
    x16, w16 = x.astype(jnp.bfloat16), jax_cluster.interleave_gate_up(gate, up).astype(jnp.bfloat16)
    plan = _gated_plan(30, 16, 16, 4, jnp.bfloat16)

    def ours16(x, w):  # through the custom VJP of the gated primitive
        return (jax_cluster.gated_ragged_dot(x, w, sizes, activation="gelu", plan=plan) * dy).sum()

    for f, (a, b), tol in ((ours, (x, jax_cluster.interleave_gate_up(gate, up)), 1e-5), (ours16, (x16, w16), 2e-2)):
        dx, dw = jax.jit(jax.grad(f, argnums=(0, 1)))(a, b)
        assert rel_error(dx, rx) < tol
        assert rel_error(dw, jax_cluster.interleave_gate_up(rg, ru)) < tol


def test_forward_mode_matches_the_separate_products():
    """jax.jvp through the gated primitive's custom JVP (the plan pins it),
    with one operand held constant too."""
    sizes = jnp.asarray([7, 0, 12, 6], jnp.int32)
    x, dx = randn((30, 16), jnp.float32), randn((30, 16), jnp.float32)
    gate, up, dgate, dup = (randn((4, 16, 8), jnp.float32) for _ in range(4))
    plan = _gated_plan(30, 16, 16, 4, jnp.float32)

    def ours(x, w):
        return jax_cluster.gated_ragged_dot(x, w, sizes, activation="silu", plan=plan)

    def theirs(x, gate, up):
        return activation_fn("silu")(jax.lax.ragged_dot(x, gate, sizes)) * jax.lax.ragged_dot(x, up, sizes)

    w, dw = jax_cluster.interleave_gate_up(gate, up), jax_cluster.interleave_gate_up(dgate, dup)
    got = jax.jvp(ours, (x, w), (dx, dw))
    want = jax.jvp(theirs, (x, gate, up), (dx, dgate, dup))
    for a, b in zip(got, want):
        assert rel_error(a, b) < 1e-5
    only_x = jax.jvp(lambda x: ours(x, w), (x,), (dx,))[1]
    assert rel_error(only_x, jax.jvp(lambda x: theirs(x, gate, up), (x,), (dx,))[1]) < 1e-5


def test_vmap_loops_over_the_mapped_axis():
    sizes = jnp.asarray([3, 5], jnp.int32)
    xs = randn((3, 8, 16), jnp.bfloat16)
    w = randn((2, 16, 32), jnp.bfloat16)
    out = jax.vmap(lambda x: jax_cluster.gated_ragged_dot(x, w, sizes))(xs)
    for i in range(3):
        assert (out[i] == jax_cluster.gated_ragged_dot(xs[i], w, sizes)).all()


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (dict(activation="swish"), "activation must be one of"),
        (dict(w_cols=24), "multiple of 16"),
        (dict(rhs_layout="kgn"), "rhs_layout"),
    ],
)
def test_bad_input_is_a_clear_error(args, match):
    w = randn((2, 8, args.pop("w_cols", 32)), jnp.bfloat16)
    with pytest.raises(ValueError, match=match):
        jax_cluster.gated_ragged_dot(randn((4, 8), jnp.bfloat16), w, jnp.asarray([2, 2]), **args)


@pytest.mark.skipif(
    not _ffi.with_kernels() or GATED_ROW not in _ffi.compiled_variant_names(), reason="built without the gated row"
)
def test_planner_takes_the_gated_row_and_explains_it():
    plan = jax_cluster.plan_ragged(
        16384, 2 * 14336, 4096, 8, problem="ragged_m", dtype=jnp.bfloat16, epilogue="gated", device=H200
    )
    assert plan.variant == GATED_ROW and plan.epilogue == "gated"
    assert "act(gate) * up" in plan.explain()
    odd = jax_cluster.plan_ragged(
        16384, 2 * 14336 + 8, 4096, 8, problem="ragged_m", dtype=jnp.bfloat16, epilogue="gated", device=H200
    )
    assert not odd.uses_kernel and "gate and up blocks" in odd.reason
    plain = jax_cluster.plan_ragged(16384, 2 * 14336, 4096, 8, problem="ragged_m", dtype=jnp.bfloat16, device=H200)
    assert plain.variant != GATED_ROW
    with pytest.raises(ValueError, match="epilogue"):
        jax_cluster.plan_ragged(64, 64, 64, 2, problem="ragged_k", dtype=jnp.bfloat16, epilogue="gated")


def test_a_plain_plan_is_refused_for_a_gated_call():
    plain = jax_cluster.plan_ragged(8, 32, 16, 2, problem="ragged_m", dtype=jnp.bfloat16)
    w = randn((2, 16, 32), jnp.bfloat16)
    with pytest.raises(ValueError, match="epilogue 'gated'"):
        jax_cluster.gated_ragged_dot(randn((8, 16), jnp.bfloat16), w, jnp.asarray([4, 4]), plan=plain)


def test_the_plan_is_frozen_with_the_epilogue():
    plan = jax_cluster.plan_ragged(8, 32, 16, 2, problem="ragged_m", dtype=jnp.bfloat16, epilogue="gated")
    assert dataclasses.replace(plan).epilogue == "gated"
