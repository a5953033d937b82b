"""How a kernel's output is judged against a float32 reference: the error
measures and the bounds every variant is held to (autotune's candidates and
the self-test alike)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

# Norm-relative error bound by output dtype.
TOLERANCE = {"bf16": 1e-2, "f16": 2e-3, "f32": 1e-4}


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
