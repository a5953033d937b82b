"""The CUDA lowering of ragged_dot, checked without a GPU: export for platform
cuda and read the custom calls, their operands and plan in the StableHLO."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import pytest
from jax import export

import jax_cluster
from jax_cluster import _ffi
from jax_cluster.planning import tables
from jax_cluster.planning.device import DeviceInfo
from jax_cluster.planning.tables import FFI_TARGETS
from jax_cluster.primitives import plans

pytestmark = pytest.mark.skipif(not _ffi.with_kernels(), reason="built without kernels")
H200 = DeviceInfo("cuda", "described H200", (9, 0), 132, 232448, 50 << 20)
DISABLED = [export.DisabledSafetyCheck.custom_call(FFI_TARGETS["ragged_dot"])]
M, K, N, G = 512, 256, 384, 8


def export_text(f, *specs):
    return export.export(jax.jit(f), platforms=("cuda",), disabled_checks=DISABLED)(*specs).mlir_module()


def spec(shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


def rhs_spec(layout):
    return spec((G, K, N) if layout == "gkn" else (G, N, K))


def calls(text):
    """(operand types, result types) of every ragged custom call."""
    pattern = rf"stablehlo.custom_call @{FFI_TARGETS['ragged_dot']}\(.*?: \(([^()]*)\) -> \(([^()]*)\)"
    return re.findall(pattern, text)


def needs_compiled_rows():
    compiled = _ffi.compiled_variant_names()
    have = {v.problem for v in tables.load_menu() if v.name in compiled and v.arch == "sm90a"}
    if not {"ragged_m", "ragged_k"} <= have:
        pytest.skip("the extension has no compiled sm90a grouped rows")


@pytest.mark.parametrize("layout", ["gkn", "gnk"])
def test_kernel_call_carries_the_plan(layout):
    needs_compiled_rows()
    b_major = "n" if layout == "gkn" else "k"
    p = jax_cluster.plan_ragged(M, N, K, G, problem="ragged_m", dtype=jnp.bfloat16, b_major=b_major, device=H200)
    assert p.path == "kernel"
    text = export_text(
        lambda l, r, g: jax_cluster.ragged_dot(l, r, g, rhs_layout=layout, plan=p),
        spec((M, K)),
        rhs_spec(layout),
        spec((G,), jnp.int32),
    )
    assert f"stablehlo.custom_call @{FFI_TARGETS['ragged_dot']}" in text
    for field, value in p.ffi_attrs().items():
        rendered = f'"{value}"' if isinstance(value, str) else f"{int(value)} : i64"
        assert re.search(rf"\b{field} = {re.escape(rendered)}", text), (field, rendered)
    # the workspace is the call's second result, sized by the plan
    assert f"tensor<{max(p.workspace_bytes, 16)}xui8>" in text
    assert "stablehlo.dot_general" not in text


@pytest.mark.parametrize("layout", ["gkn", "gnk"])
def test_gradient_uses_grouped_kernels_in_place(layout):
    needs_compiled_rows()
    f = jax.grad(
        lambda l, r, g: (
            jax_cluster.ragged_dot(
                l,
                r,
                g,
                rhs_layout=layout,
                plan=jax_cluster.plan_ragged(
                    M,
                    N,
                    K,
                    G,
                    problem="ragged_m",
                    dtype=jnp.bfloat16,
                    b_major="n" if layout == "gkn" else "k",
                    device=H200,
                ),
            )
            .astype(jnp.float32)
            .sum()
        ),
        argnums=(0, 1),
    )
    text = export_text(f, spec((M, K)), rhs_spec(layout), spec((G,), jnp.int32))
    assert len(calls(text)) >= 2  # both gradients (the forward may be dropped)
    assert "_ragged_k_" in text  # d_rhs is the ragged-contraction variant
    assert "stablehlo.transpose" not in text


def _hand_made_kernel_plans(monkeypatch):
    """Every ragged call plans a kernel, whatever this build compiled: the
    lowering and the operands it hands to C++ can be read anyway."""
    real = plans.plan_ragged

    def plan(*args, problem, b_major, **kw):
        p = real(*args, problem=problem, b_major=b_major, **{**kw, "path": "xla"})
        return dataclasses.replace(
            p,
            path="kernel",
            variant=f"hand_made_{problem}_{b_major}",
            arch="sm90a",
            schedule="dynamic",
            workspace_bytes=4096,
        )

    monkeypatch.setattr(plans, "plan_ragged", plan)


@pytest.mark.parametrize("layout", ["gkn", "gnk"])
def test_operands_of_every_call(layout, monkeypatch):
    _hand_made_kernel_plans(monkeypatch)
    b = f"{G}x{K}x{N}" if layout == "gkn" else f"{G}x{N}x{K}"
    forward = export_text(
        lambda l, r, g: jax_cluster.ragged_dot(l, r, g, rhs_layout=layout),
        spec((M, K)),
        rhs_spec(layout),
        spec((G,), jnp.int32),
    )
    assert calls(forward) == [
        (f"tensor<{M}x{K}xbf16>, tensor<{b}xbf16>, tensor<{G}xi32>", f"tensor<{M}x{N}xbf16>, tensor<4096xui8>")
    ]
    assert f"hand_made_ragged_m_{'n' if layout == 'gkn' else 'k'}" in forward

    f = jax.grad(
        lambda l, r, g: jax_cluster.ragged_dot(l, r, g, rhs_layout=layout).astype(jnp.float32).sum(), argnums=(0, 1)
    )
    text = export_text(f, spec((M, K)), rhs_spec(layout), spec((G,), jnp.int32))
    got = set(calls(text))
    # d_lhs: dy [M,N] against rhs read with the flipped layout, in place
    assert (
        f"tensor<{M}x{N}xbf16>, tensor<{b}xbf16>, tensor<{G}xi32>",
        f"tensor<{M}x{K}xbf16>, tensor<4096xui8>",
    ) in got
    assert f"hand_made_ragged_m_{'k' if layout == 'gkn' else 'n'}" in text
    # d_rhs: lhs^T dy per group for [G,K,N]; dy^T lhs, directly [G,N,K], for gnk
    first, second = (f"{M}x{K}", f"{M}x{N}") if layout == "gkn" else (f"{M}x{N}", f"{M}x{K}")
    assert (
        f"tensor<{first}xbf16>, tensor<{second}xbf16>, tensor<{G}xi32>",
        f"tensor<{b}xbf16>, tensor<4096xui8>",
    ) in got
    assert "hand_made_ragged_k_n" in text
    assert "stablehlo.transpose" not in text


def test_misaligned_call_lowers_to_xla():
    p = jax_cluster.plan_ragged(64, 64, 7, 2, problem="ragged_m", dtype=jnp.bfloat16, device=H200)
    assert p.path == "xla"
    text = export_text(
        lambda l, r, g: jax_cluster.ragged_dot(l, r, g, plan=p), spec((64, 7)), spec((2, 7, 64)), spec((2,), jnp.int32)
    )
    assert FFI_TARGETS["ragged_dot"] not in text and "stablehlo.dot_general" in text
