"""The weight-block quantization kernel (kernels/weight_block_quantize.cu) on
the GPU against the same primitive's XLA form: bitwise-equal values in both
layouts and scales for every input and output format, and the fp8 recipe's
gradients through either form."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import WEIGHT_BLOCK_AMAX, compiled_text, fp8_accumulation_case, in_while_loops

from jax_cluster.ops.fp8_training import fp8_grouped, fp8_linear
from jax_cluster.planning.tables import FFI_TARGETS
from jax_cluster.primitives.weight_block_quantize import kernel_default_as, quantize_weight_blocks

pytestmark = pytest.mark.gpu
SHAPES = {"one dense weight": (1, 384, 640), "experts": (8, 256, 1152), "many small experts": (300, 128, 256)}


def _both(w, dtype):
    run = jax.jit(quantize_weight_blocks, static_argnums=1, static_argnames="use_kernel")
    return run(w, dtype, use_kernel=True), run(w, dtype, use_kernel=False)


def _assert_bitwise(got, want):
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


@pytest.mark.parametrize("label", list(SHAPES))
@pytest.mark.parametrize("dtype", [jnp.float8_e4m3fn, jnp.float8_e5m2])
@pytest.mark.parametrize("w_dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_the_kernel_writes_what_xla_computes(label, dtype, w_dtype):
    shape = SHAPES[label]
    w = (jax.random.normal(jax.random.key(len(label)), shape) * 5.0).astype(w_dtype)
    w = w.at[0, :128, :128].set(0)  # an all-zero block: scale 1
    w = w.at[-1, shape[1] - 3, 7].set(jnp.nan)  # a NaN spoils its own block, as in XLA
    w = w.at[0, shape[1] - 1, shape[2] - 5].set(1e4)  # past e4m3's range before scaling
    _assert_bitwise(*_both(w, dtype))


def test_the_kernel_leaves_no_byte_unwritten():
    """Outputs are fresh XLA buffers: a skipped element would differ between runs."""
    w = jax.random.normal(jax.random.key(1), (3, 512, 384), jnp.bfloat16)
    first, _ = _both(w, jnp.float8_e4m3fn)
    again, _ = _both(w + 0, jnp.float8_e4m3fn)
    assert np.isfinite(np.asarray(first[2])).all()
    _assert_bitwise(first, again)


def test_an_empty_stack_is_a_no_op():
    (kn, nk, scales), _ = _both(jnp.zeros((0, 128, 256), jnp.bfloat16), jnp.float8_e4m3fn)
    assert kn.shape == (0, 128, 256) and nk.shape == (0, 256, 128) and scales.shape == (0, 1, 2)


def _grads(fn, *args):
    return jax.jit(jax.grad(lambda *a: (fn(*a).astype(jnp.float32) ** 2).sum(), argnums=(0, 1)))(*args)


def test_the_recipe_is_the_same_through_either_form():
    x = jax.random.normal(jax.random.key(2), (512, 384), jnp.bfloat16)
    w = (jax.random.normal(jax.random.key(3), (384, 640)) * 0.05).astype(jnp.bfloat16)
    wg = (jax.random.normal(jax.random.key(4), (4, 384, 640)) * 0.05).astype(jnp.bfloat16)
    sizes = jnp.asarray([200, 0, 250, 62], jnp.int32)
    for fn, weight in ((lambda x, w: fp8_linear(x, w), w), (lambda x, w: fp8_grouped(x, w, sizes), wg)):
        with kernel_default_as(True):
            fused = _grads(fn, x, weight)
        with kernel_default_as(False):
            plain = _grads(fn, x, weight)
        for a, b in zip(fused, plain):
            np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_gradient_accumulation_hoists_the_kernel_wherever_xla_hoists_its_form():
    """Micro-batches in a lax.scan over one set of weights: one weight-block
    call per step, and outside the loop wherever the compiler moves XLA's own
    form out (its CPU pipeline does; a GPU pipeline may keep both inside)."""
    # each form traces a case of its own: jit reuses a function's trace, and
    # the form is chosen while tracing
    accumulate, _, w, xs = fp8_accumulation_case()
    with kernel_default_as(False):
        xla_hlo = compiled_text(jax.jit(accumulate), w, xs)
    # where the compiler rewrote that reduction past recognition, hoisting is not compared
    xla_form_in_loop = WEIGHT_BLOCK_AMAX not in xla_hlo or bool(in_while_loops(xla_hlo, WEIGHT_BLOCK_AMAX))
    with kernel_default_as(True):
        # one call in the step (XLA may also unroll so short a loop)
        in_loops = _one_kernel_call_per_step(*fp8_accumulation_case())
    assert xla_form_in_loop or not in_loops, "XLA hoists its own form but not the kernel"


def _one_kernel_call_per_step(accumulate, weight_gradient, w, xs):
    """Checks the compiled step's one weight-block kernel call and its
    gradients against quantizing per micro-batch; returns the loops holding
    the call (skips where the kernel does not run)."""
    run = jax.jit(accumulate)
    hlo = compiled_text(run, w, xs)
    target = FFI_TARGETS["quantize_weight_blocks"]
    if target not in hlo:
        pytest.skip("the weight-block kernel does not run here")
    assert hlo.count(f'custom_call_target="{target}"') == 1
    want = sum(jax.jit(weight_gradient)(x, w) for x in xs)
    np.testing.assert_allclose(np.asarray(run(w, xs)), np.asarray(want), rtol=1e-5, atol=1e-6)
    return in_while_loops(hlo, target)


def test_weights_quantized_ahead_take_one_kernel_call_outside_the_loop():
    """The same step with the weights quantized once before the loop
    (fp8_weights): one weight-block call, outside the loop whatever the
    compiler hoists, and the gradients of the step that quantizes per call."""
    with kernel_default_as(True):
        assert not _one_kernel_call_per_step(*fp8_accumulation_case(ahead=True))
