"""How a kernel's output is judged against a float32 reference: the error
measures and the bounds every variant is held to (autotune's candidates and
the self-test alike)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jax_cluster.planning import tables

# Norm-relative error bound by output dtype.
TOLERANCE = {"bf16": 1e-2, "f16": 2e-3, "f32": 1e-4}
# fp8 wgmma sums its products in an accumulator narrower than float32 before
# the blockwise mainloop promotes each 128-deep K block to float32, so a
# float32 output of fp8 operands carries about 1.3e-4 of error by itself
# (measured on an H200, 2026-12-02); its bound is set by that, not by the output.
FP8_ACCUMULATION_TOLERANCE = 1e-3


def tolerance(out_dtype: str, operand_dtype: str | None = None) -> float:
    """The norm-relative bound for a product of `operand_dtype` written as `out_dtype`."""
    if operand_dtype in tables.BLOCK_SCALED_DTYPES:
        return max(TOLERANCE[out_dtype], FP8_ACCUMULATION_TOLERANCE)
    return TOLERANCE[out_dtype]


def reference(a, b, a_major, b_major):
    """A·B in float32 at full precision, from the operands as stored."""
    nb = a.ndim - 2
    batch = tuple(range(nb))
    dims = (((nb + 1 if a_major == "k" else nb,), (nb + 1 if b_major == "k" else nb,)), (batch, batch))
    return lax.dot_general(a.astype(jnp.float32), b.astype(jnp.float32), dims, precision=lax.Precision.HIGHEST)


@jax.jit
def relative_error(out, ref):
    """||out - ref|| / ||ref||, and inf when `out` holds a NaN or an infinity."""
    out = out.astype(jnp.float32)
    err = jnp.linalg.norm(out - ref) / jnp.maximum(jnp.linalg.norm(ref), 1e-30)
    return jnp.where(jnp.isfinite(out).all(), err, jnp.inf)


def errors(out, ref):
    """(norm-relative, max-relative) error; a skipped or NaN element fails outright."""
    out = out.astype(jnp.float32)
    finite = jnp.isfinite(out).all()
    rel = jnp.linalg.norm(out - ref) / jnp.linalg.norm(ref)
    worst = jnp.abs(out - ref).max() / jnp.abs(ref).max()
    return jnp.where(finite, rel, jnp.inf), jnp.where(finite, worst, jnp.inf)
