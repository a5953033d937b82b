"""The CUDA lowering, checked without a GPU: export for platform cuda and read
the custom call and its plan attribute in the StableHLO."""

import re

import jax
import jax.numpy as jnp
import pytest
from jax import export

import jax_cluster
from jax_cluster import _ffi
from jax_cluster.planning.device import DeviceInfo
from jax_cluster.planning.tables import FFI_TARGETS

pytestmark = pytest.mark.skipif(not _ffi.with_kernels(), reason="built without kernels")
H200 = DeviceInfo("cuda", "described H200", (9, 0), 132, 232448, 50 << 20)
DISABLED = [export.DisabledSafetyCheck.custom_call(FFI_TARGETS["gemm"])]


def export_text(f, *specs):
    return export.export(jax.jit(f), platforms=("cuda",), disabled_checks=DISABLED)(*specs).mlir_module()


def spec(shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


def test_kernel_call_carries_the_plan():
    p = jax_cluster.plan(512, 1024, 2048, dtype=jnp.bfloat16, device=H200)
    assert p.path == "kernel"
    text = export_text(lambda a, b: jax_cluster.matmul(a, b, plan=p), spec((512, 2048)), spec((2048, 1024)))
    assert f"stablehlo.custom_call @{FFI_TARGETS['gemm']}" in text
    for field, value in p.ffi_attrs().items():
        rendered = f'"{value}"' if isinstance(value, str) else f"{int(value)} : i64"
        assert re.search(rf"\b{field} = {re.escape(rendered)}", text), (field, rendered)
    # the workspace is the call's second result, sized by the plan
    assert f"tensor<{max(p.workspace_bytes, 16)}xui8>" in text
    assert "stablehlo.dot_general" not in text


def test_gradient_uses_the_kernel_with_flipped_layouts():
    a, b = spec((256, 512)), spec((512, 384))
    f = jax.grad(
        lambda a, b: (
            jax_cluster.matmul(a, b, plan=jax_cluster.plan(256, 384, 512, dtype=jnp.bfloat16, device=H200))
            .astype(jnp.float32)
            .sum()
        ),
        argnums=(0, 1),
    )
    text = export_text(f, a, b)
    assert text.count(f"@{FFI_TARGETS['gemm']}") >= 2  # both gradients (the forward may be dropped)
    assert "_mn_" in text  # the weight gradient reads A transposed in place
    assert "stablehlo.transpose" not in text


def test_misaligned_call_lowers_to_xla_dot():
    p = jax_cluster.plan(64, 64, 7, dtype=jnp.bfloat16, device=H200)
    text = export_text(lambda a, b: jax_cluster.matmul(a, b, plan=p), spec((64, 7)), spec((7, 64)))
    assert FFI_TARGETS["gemm"] not in text and "stablehlo.dot_general" in text


@pytest.mark.parametrize("m,n,k,wide", [(64, 64, 8, False), (64, 64, 1, True), (1, 1, 64, True)])
def test_gpu_fallback_writes_the_output_dtype_unless_degenerate(m, n, k, wide):
    """A bf16 result straight from cuBLAS (fp32 accumulation either way); an fp32
    result and a cast would cost a pass over D. Degenerate dots keep the fp32
    result: XLA turns them into bf16 multiply-reduces."""
    p = jax_cluster.plan(m, n, k, dtype=jnp.bfloat16, device=H200, path="xla")
    text = export_text(lambda a, b: jax_cluster.matmul(a, b, plan=p), spec((m, k)), spec((k, n)))
    dot = next(line for line in text.splitlines() if "stablehlo.dot_general" in line)
    assert f"-> tensor<{m}x{n}x{'f32' if wide else 'bf16'}>" in dot, dot
