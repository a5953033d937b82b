"""`precision=` as lax takes it: refused where lax refuses it, and honoured
where it changes the result. On a GPU a float32 dot runs TF32 unless asked
for more, so the CUDA export (read here without a GPU) must carry the
precision to XLA's dot; bf16 and fp16 products are exact in fp32, and there
the kernels' path, which has no such setting, is kept."""

import re

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax import export, lax

import jax_cluster
from jax_cluster import _ffi
from jax_cluster import nn as jcnn
from jax_cluster.planning import device
from jax_cluster.planning.device import DeviceInfo
from jax_cluster.planning.tables import FFI_TARGETS

DISABLED = [export.DisabledSafetyCheck.custom_call(t) for t in FFI_TARGETS.values()]
KN = (((1,), (0,)), ((), ()))
BAD = ["garbage", 7, ("highest", "nonsense")]
H200 = DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132, 232448, 50 << 20)


@pytest.fixture(autouse=True)
def default_precision():
    """The suite asks XLA for its highest precision everywhere (conftest);
    here a dot without a precision must show as one."""
    with jax.default_matmul_precision("default"):
        yield


def cuda_text(f, *args):
    return export.export(jax.jit(f), platforms=("cuda",), disabled_checks=DISABLED)(*args).mlir_module()


def precisions(text):
    return re.findall(r"precision = \[(\w+), (\w+)\]", text)


def spec(shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


OPS = {
    "matmul": lambda a, b, p: jax_cluster.matmul(a, b, precision=p),
    "dot_general": lambda a, b, p: jax_cluster.dot_general(a, b, KN, precision=p),
    "ragged_dot": lambda a, b, p: jax_cluster.ragged_dot(a, b[None], jnp.array([a.shape[0]], jnp.int32), p),
}


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("precision", BAD, ids=str)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=lambda d: jnp.dtype(d).name)
def test_a_precision_lax_refuses_is_refused(op, precision, dtype):
    a, b = jnp.ones((8, 16), dtype), jnp.ones((16, 32), dtype)
    with pytest.raises(ValueError, match=f"jax_cluster.{op}: Precision"):
        OPS[op](a, b, precision)


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("precision", [lax.Precision.HIGHEST, "highest", ("highest", "highest")], ids=str)
def test_float32_products_carry_the_precision_to_xla(op, precision):
    text = cuda_text(lambda a, b: OPS[op](a, b, precision), spec((256, 128)), spec((128, 64)))
    assert precisions(text) == [("HIGHEST", "HIGHEST")]


@pytest.mark.skipif(not _ffi.with_kernels(), reason="built without kernels")
@pytest.mark.parametrize("op", sorted(OPS))
def test_bf16_products_keep_the_kernel_path(op, monkeypatch):
    """A precision changes no bf16 product, so it does not move the call off
    the kernel (planned here for a described H200; the suite pins kernels)."""
    monkeypatch.setattr(device, "_describe_present", lambda _: H200)
    a, b = spec((256, 128), jnp.bfloat16), spec((128, 64), jnp.bfloat16)
    text = cuda_text(lambda a, b: OPS[op](a, b, "highest"), a, b)
    target = FFI_TARGETS["ragged_dot" if op == "ragged_dot" else "gemm"]
    assert f"custom_call @{target}(" in text and "HIGHEST" not in text


def test_layers_carry_their_precision():
    x = spec((64, 128))
    nnx_layer = jcnn.Linear(128, 64, precision=lax.Precision.HIGHEST, rngs=nnx.Rngs(0))
    assert precisions(cuda_text(lambda x: nnx_layer(x), x)) == [("HIGHEST", "HIGHEST")]
    linen_layer = jcnn.Dense(64, precision=lax.Precision.HIGHEST)
    params = linen_layer.init(jax.random.key(0), jnp.ones((64, 128)))
    assert precisions(cuda_text(lambda x: linen_layer.apply(params, x), x)) == [("HIGHEST", "HIGHEST")]
    with pytest.raises(ValueError, match="Precision"):
        jcnn.Linear(128, 64, dtype=jnp.bfloat16, precision="garbage", rngs=nnx.Rngs(0))(jnp.ones((4, 128)))


@pytest.mark.skipif(not _ffi.with_kernels(), reason="built without kernels")
@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("algorithm", [lax.DotAlgorithmPreset.F16_F16_F32, "BF16_BF16_BF16"], ids=str)
def test_a_dot_algorithm_moves_even_bf16_products_to_xla(op, algorithm, monkeypatch):
    """An algorithm changes a bf16 product (fp16 rounding, bf16 accumulation),
    which only XLA's dot applies; the default preset is no change."""
    monkeypatch.setattr(device, "_describe_present", lambda _: H200)
    a, b = spec((256, 128), jnp.bfloat16), spec((128, 64), jnp.bfloat16)
    text = cuda_text(lambda a, b: OPS[op](a, b, algorithm), a, b)
    assert "custom_call @jax_cluster" not in text and "algorithm" in text
    default = cuda_text(lambda a, b: OPS[op](a, b, lax.DotAlgorithmPreset.DEFAULT), a, b)
    assert "custom_call @jax_cluster" in default
