"""`jax_cluster.linear`: a dense layer's forward pass in one kernel.

y = act(alpha * x @ kernel + beta * residual + bias), with the bias, the
activation and the residual add applied in the GEMM's epilogue on sm90a and
sm100f ("bias_act" menu rows), and on XLA elsewhere. Under differentiation
the backward needs the pre-activation z, so the activation runs on XLA, and
so do the bias and residual: they join the activation's pass over the plain
GEMM's output, where the fused epilogue would only slow the GEMM (the H200's
2048x2048->8192 layer step: 0.323 ms with the bias fused, 0.314 ms without;
Flax 0.301; measured on 2026-12-01). Without an activation the fused
kernel writes the layer's output, so it stays. Differentiation goes through
a custom JVP, so forward mode (jax.jvp, jacfwd, linearize) works as for
Flax's layer, and the backward pass is the JVP transposed: two jax_cluster
GEMMs plus XLA's elementwise work, the graph behind Flax's nnx.Linear.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_cluster.ops.tangents import bilinear_tangent, is_zero
from jax_cluster.planning.tables import ACTIVATIONS
from jax_cluster.primitives.activations import activation_fn, epilogue_in_dtype
from jax_cluster.primitives.epilogue import gemm_epilogue
from jax_cluster.primitives.gemm import gemm


def linear(
    x,
    kernel,
    bias=None,
    *,
    activation: str = "none",
    residual=None,
    alpha: float = 1.0,
    beta: float | None = None,
    kernel_layout: str = "kn",
    out_dtype=None,
):
    """act(alpha * x @ kernel + beta * residual + bias) on one fused kernel.

    x is [..., K]; kernel is [K, N] (`kernel_layout="kn"`, Flax's layout) or
    [N, K] ("nk"), read in place; bias is [N]; residual has the output's shape.
    The residual is added before the activation, so the usual blocks fuse
    whole: act(x @ W1 + b1) and then h @ W2 + b2 + x. `beta` defaults to 1
    with a residual and 0 without. activation: "none", "relu", "gelu" (tanh
    form, jax.nn.gelu's default), "gelu_exact" or "silu". The output dtype is
    `out_dtype` or x's; bias and residual are cast to it.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"jax_cluster.linear: unknown activation {activation!r}; choose from {sorted(ACTIVATIONS)}")
    if kernel_layout not in ("kn", "nk"):
        raise ValueError(f"jax_cluster.linear: kernel_layout must be 'kn' or 'nk', got {kernel_layout!r}")
    x, kernel = jnp.asarray(x), jnp.asarray(kernel)
    if kernel.ndim != 2 or x.ndim < 1:
        raise ValueError(f"jax_cluster.linear: kernel must be rank 2 and x rank >= 1, got {x.shape} and {kernel.shape}")
    k, n = kernel.shape if kernel_layout == "kn" else kernel.shape[::-1]
    if x.shape[-1] != k:
        raise ValueError(
            f"jax_cluster.linear: x {x.shape} has K={x.shape[-1]}, kernel {kernel.shape} ({kernel_layout}) has K={k}"
        )
    dtype = jnp.result_type(x, kernel)
    out_dtype = np.dtype(out_dtype if out_dtype is not None else dtype)
    lead = x.shape[:-1]
    x2 = x.astype(dtype).reshape(-1, k)
    if bias is not None:
        bias = jnp.asarray(bias)
        if bias.shape != (n,):
            raise ValueError(f"jax_cluster.linear: bias must be [{n}], got {bias.shape}")
        bias = bias.astype(out_dtype)
    if residual is not None:
        residual = jnp.asarray(residual)
        if residual.shape != (*lead, n):
            raise ValueError(f"jax_cluster.linear: residual must be {[*lead, n]}, got {list(residual.shape)}")
        residual = residual.astype(out_dtype).reshape(-1, n)
    beta = float(beta if beta is not None else (1.0 if residual is not None else 0.0))
    config = (activation, float(alpha), beta, "n" if kernel_layout == "kn" else "k", out_dtype)
    y = _linear(config, x2, kernel.astype(dtype), bias, residual)
    return y.reshape(*lead, n)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _linear(config, x, kernel, bias, residual):
    return _fused(config, x, kernel, bias, residual)


def _fused(config, x, kernel, bias, residual):
    """The layer in one kernel call, its epilogue included (a primitive of
    its own, so remat policies see the product, not a custom_jvp call)."""
    activation, alpha, beta, b_major, out_dtype = config
    return gemm_epilogue(
        x, kernel, bias, residual, b_major=b_major, out_dtype=out_dtype, alpha=alpha, beta=beta, activation=activation
    )


def _linear_jvp(config, primals, tangents):
    """y = act(z), z = alpha * x·W + beta * residual + bias, and
    dy = act'(z) · (alpha * (dx·W + x·dW) + beta * dresidual + dbias).

    Without an activation the fused kernel writes y. With one, y needs z, so
    the product runs plain and XLA applies the epilogue in z's dtype. The
    tangent's products are plain GEMMs; transposed (jax.grad) they are the
    input- and weight-gradient GEMMs, each planned for its own layout, and
    act' and the bias gradient (a reduce in z's dtype) are what Flax's layer
    differentiates into. Forward mode (jax.jvp, jacfwd) runs the rule as it is."""
    activation, alpha, beta, b_major, out_dtype = config
    x, kernel, bias, residual = primals
    dx, dkernel, dbias, dresidual = tangents
    product = functools.partial(gemm, a_major="k", b_major=b_major, out_dtype=out_dtype)
    epilogue = functools.partial(epilogue_in_dtype, alpha=alpha, beta=beta, activation="none")
    if activation == "none":  # the fused kernel writes the layer's output
        z = _fused(config, x, kernel, bias, residual)
    else:
        z = epilogue(product(x, kernel), bias, residual)
    dz = bilinear_tangent(product, x, kernel, dx, dkernel, like=z)
    dz = epilogue(dz, *(None if is_zero(t) else t for t in (dbias, dresidual)))
    if activation == "none":
        return z, dz
    return jax.jvp(activation_fn(activation), (z,), (dz,))


_linear.defjvp(_linear_jvp, symbolic_zeros=True)
