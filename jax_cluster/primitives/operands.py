"""Operand rules the primitives share: dtypes, the GEMM view of the operand
shapes, and the cotangent dtype of the backward products."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jax_cluster.planning.plan import dtype_name
from jax_cluster.planning.tables import BLOCK_SCALED_DTYPES, GATE_BLOCK, NUMPY_DTYPES, OUTPUT_DTYPES, SCALE_BLOCK

# What the primitives take: the contract's dtypes (the kernels read the
# input ones; f32 operands run on XLA inside the same primitive). fp8 comes
# with block scales and goes to the block-scaled GEMM alone.
SUPPORTED_DTYPES = tuple(jnp.dtype(n) for name, n in NUMPY_DTYPES.items() if name not in BLOCK_SCALED_DTYPES)
# (the fp8 values' numpy dtypes, once each: mxe4m3's values are e4m3's)
SCALED_DTYPES = tuple(dict.fromkeys(jnp.dtype(NUMPY_DTYPES[name]) for name in BLOCK_SCALED_DTYPES))
# B's major in the other product of a transpose: [K,N] read as [N,K] and back.
FLIP_B = {"k": "n", "n": "k"}


def check_dtypes(who, out_dtype, **operands):
    """The dtype rules of the kernels' primitives: two operands by their labels."""
    for name, x in operands.items():
        if not any(x.dtype == np.dtype(t) for t in SUPPORTED_DTYPES):
            raise TypeError(f"{who}: unsupported dtype {x.dtype} for {name}; use bfloat16, float16 or float32")
    (na, a), (nb, b) = operands.items()
    if a.dtype != b.dtype:
        raise TypeError(f"{who}: {na} and {nb} dtypes differ ({a.dtype} vs {b.dtype})")
    if not any(np.dtype(out_dtype) == np.dtype(t) for t in SUPPORTED_DTYPES):
        raise TypeError(f"{who}: unsupported output dtype {np.dtype(out_dtype)}")


def check_scaled_operands(who, a, b, k: int, out_dtype, scales, *, block=SCALE_BLOCK, scale_dtype=jnp.float32) -> None:
    """The block-scaled GEMMs' rules: fp8 values of one format, K in whole
    scale blocks, an output the kernels write, and scales of `scale_dtype`
    and the shapes in `scales` ((label, array, wanted shape) each)."""
    if k % block:
        raise ValueError(f"{who}: K = {k} is not a multiple of the scale block {block}")
    for name, x in (("a", a), ("b", b)):
        if jnp.dtype(x.dtype) not in SCALED_DTYPES:
            formats = ", ".join(map(str, SCALED_DTYPES))
            raise TypeError(f"{who}: {name} must hold fp8 values ({formats}), got {x.dtype}")
    if a.dtype != b.dtype:
        raise TypeError(f"{who}: a and b hold different fp8 formats ({a.dtype} and {b.dtype})")
    outputs = OUTPUT_DTYPES[dtype_name(a.dtype)]
    if dtype_name(out_dtype) not in outputs:
        raise TypeError(f"{who}: the output must be one of {outputs}, got {np.dtype(out_dtype)}")
    for name, scale, want in scales:
        if scale.dtype != scale_dtype or tuple(scale.shape) != want:
            wanted = jnp.dtype(scale_dtype).name
            raise ValueError(f"{who}: {name} must be {wanted} {list(want)}, got {scale.dtype} {list(scale.shape)}")


def gemm_dims(a_shape, b_shape, a_major, b_major):
    """(batch, M, N, K of A, K of B) read from the operand shapes."""
    a0, a1 = a_shape[-2:]
    b0, b1 = b_shape[-2:]
    m, ka = (a0, a1) if a_major == "k" else (a1, a0)
    n, kb = (b0, b1) if b_major == "k" else (b1, b0)
    return a_shape[:-2], m, n, ka, kb


def gemm_view(a_shape, b_shape, problem, b_major, blocks=1) -> tuple[int, int, int]:
    """(m, n, k) of one row block of a grouped problem, as the planner and the kernel see it."""
    rows = a_shape[0] // blocks
    if problem == "ragged_k":
        return a_shape[1], b_shape[1], rows
    n, k = (b_shape[2], b_shape[1]) if b_major == "n" else (b_shape[1], b_shape[2])
    return rows, n, k


def ragged_out_shape(a_shape, b_shape, groups, problem, b_major):
    if problem == "ragged_k":
        return groups, a_shape[1], b_shape[1]
    return a_shape[0], (b_shape[2] if b_major == "n" else b_shape[1])


def ct_as(ct, like):
    """Cotangent in the operand dtype: the kernels take one input dtype."""
    return ct.astype(like.aval.dtype)


# The gated product's B: gate and up columns in alternating blocks of GATE_BLOCK, gate first.
_GATED = "jax_cluster.gated_ragged_dot"


def interleave(gate, up):
    """[..., H] gate and up -> [..., 2H] in alternating blocks of GATE_BLOCK columns."""
    if gate.shape != up.shape or gate.shape[-1] % GATE_BLOCK:
        raise ValueError(
            f"{_GATED}: gate and up must have one shape whose last dimension is a multiple of "
            f"{GATE_BLOCK}, got {gate.shape} and {up.shape}"
        )
    blocks = (*gate.shape[:-1], gate.shape[-1] // GATE_BLOCK, 1, GATE_BLOCK)
    both = jnp.concatenate([gate.reshape(blocks), up.reshape(blocks)], axis=-2)
    return both.reshape(*gate.shape[:-1], 2 * gate.shape[-1])


def deinterleave(gate_up):
    """The inverse of `interleave`: [..., 2H] -> (gate, up), each [..., H]."""
    width = gate_up.shape[-1]
    if width % (2 * GATE_BLOCK):
        raise ValueError(f"{_GATED}: the last dimension {width} is not a multiple of {2 * GATE_BLOCK}")
    blocks = gate_up.reshape(*gate_up.shape[:-1], width // (2 * GATE_BLOCK), 2, GATE_BLOCK)
    half = (*gate_up.shape[:-1], width // 2)
    return blocks[..., 0, :].reshape(half), blocks[..., 1, :].reshape(half)
