"""jax_cluster.linear's CUDA lowering, checked without a GPU: the fused
kernel carries the epilogue's scalars, and the gradient uses plain GEMMs."""

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

H200 = DeviceInfo("cuda", "described H200", (9, 0), 132, 232448, 50 << 20)
FUSED = [v.name for v in tables.load_menu() if v.epilogue == "bias_act" and v.arch == "sm90a"]
pytestmark = pytest.mark.skipif(
    not _ffi.with_kernels() or not set(FUSED) & _ffi.compiled_variant_names(),
    reason="built without the fused-epilogue kernels",
)
DISABLED = [export.DisabledSafetyCheck.custom_call(t) for t in (FFI_TARGETS["gemm"], FFI_TARGETS["gemm_epilogue"])]


def export_text(f, *specs):
    return export.export(jax.jit(f), platforms=("cuda",), disabled_checks=DISABLED)(*specs).mlir_module()


def spec(shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


@pytest.fixture(autouse=True)
def described_h200(monkeypatch):
    """Plans made inside the traced function see an H200, not this CPU."""
    from jax_cluster.planning import device

    monkeypatch.setattr(device, "_describe_present", lambda _: H200)


def test_forward_is_one_fused_call_with_its_scalars():
    text = export_text(
        lambda x, w, b, r: jax_cluster.linear(x, w, b, residual=r, alpha=0.5, activation="gelu"),
        spec((512, 256)),
        spec((256, 384)),
        spec((384,)),
        spec((512, 384)),
    )
    assert text.count(f"stablehlo.custom_call @{FFI_TARGETS['gemm_epilogue']}") == 1
    assert re.search(r"activation = 2 : i32", text) and re.search(r"alpha = 5.0+e-01 : f32", text)
    assert re.search(r"beta = 1.0+e\+00 : f32", text)
    assert "_bias_act" in text
    assert "stablehlo.dot_general" not in text and "tanh" not in text


def test_gradient_with_an_activation_runs_plain_gemms():
    """The backward keeps z, so act, bias and residual run in XLA's pass over
    the plain forward GEMM's output: three plain GEMMs, no fused call."""
    f = jax.grad(
        lambda x, w, b, r: jax_cluster.linear(x, w, b, residual=r, activation="silu").astype(jnp.float32).sum(),
        argnums=(0, 1, 2, 3),
    )
    text = export_text(f, spec((512, 256)), spec((256, 384)), spec((384,)), spec((512, 384)))
    assert f"@{FFI_TARGETS['gemm_epilogue']}" not in text
    assert text.count(f"@{FFI_TARGETS['gemm']}(") == 3  # z0, dx and dW
    assert "stablehlo.dot_general" not in text


def test_gradient_without_an_activation_runs_the_fused_kernel_and_plain_gemms():
    """Without an activation the fused kernel's output is the layer's output."""
    f = jax.grad(
        lambda x, w, b: (jax_cluster.linear(x, w, b).astype(jnp.float32) ** 2).sum(), argnums=(0, 1, 2)
    )  # squared, so the gradient needs the forward's output
    text = export_text(f, spec((512, 256)), spec((256, 384)), spec((384,)))
    assert f"@{FFI_TARGETS['gemm_epilogue']}" in text and "activation = 0 : i32" in text
    assert text.count(f"@{FFI_TARGETS['gemm']}(") == 2  # dx and dW
    assert "stablehlo.dot_general" not in text


def test_f32_inputs_fall_back_to_xla():
    text = export_text(
        lambda x, w: jax_cluster.linear(x, w, activation="relu"),
        spec((64, 64), jnp.float32),
        spec((64, 64), jnp.float32),
    )
    assert f"custom_call @{FFI_TARGETS['gemm_epilogue']}" not in text
    assert "stablehlo.dot_general" in text
