"""The block-scaled fp8 GEMM: D = (A x its scales) . (B x its scales)^T,
DeepSeek-V3's blockwise recipe on CUTLASS's blockwise-scaled mainloop.

  a        [M, K]  fp8 values, read K-major (fp8 wgmma reads no other layout)
  b        [N, K]  fp8 values, K-major
  scale_a  [K/128, M]           float32: A's 1 x 128 tiles along K
  scale_b  [K/128, ceil(N/128)] float32: B's 128 x 128 blocks

Both scale arrays run over K blocks first (the layout the mainloop reads);
K is a multiple of 128. The kernel scales each K block's fp32 partial sums
before adding them to the accumulators, and writes bfloat16.

MXFP8 (sm100f): the same call with e8m0 scales names the MX format, one
scale per 32 values along K of A and of B, each flat in the kernel's layout
(primitives/mx_scales.py): scale_a [mx_scales.layout_size(M, K)], scale_b
[mx_scales.layout_size(N, K)]; K a multiple of 128. The op takes
one device (a sharded call gathers its operands: there is no partitioning
rule), has no vmap rule, and is not differentiable: the fp8 training recipe
(ops/fp8_training.py) quantizes each product's operands itself.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jax_cluster.planning.call import Call
from jax_cluster.planning.plan import Plan, dtype_name
from jax_cluster.planning.tables import MX_DTYPE, MX_SCALE_BLOCK, SCALE_BLOCK
from jax_cluster.primitives import plans
from jax_cluster.primitives.lowering import scaled_gemm_local_p
from jax_cluster.primitives.mx_scales import SCALE_DTYPE, is_mx_scale, layout_size
from jax_cluster.primitives.operands import check_scaled_operands

_WHO = "jax_cluster scaled_gemm"


def _check(a, b, scale_a, scale_b, out_dtype) -> tuple[int, int, int]:
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"{_WHO}: a must be [M, K] and b [N, K], got shapes {a.shape} and {b.shape}")
    (m, k), (n, kb) = a.shape, b.shape
    if k != kb:
        raise ValueError(f"{_WHO}: contracting dimensions differ: a {a.shape} has K={k}, b {b.shape} has K={kb}")
    if is_mx_scale(scale_a):
        if k % SCALE_BLOCK:  # the MX kernel's K tile
            raise ValueError(f"{_WHO}: MX operands need K a multiple of {SCALE_BLOCK}, got K = {k}")
        scales = (("scale_a", scale_a, (layout_size(m, k),)), ("scale_b", scale_b, (layout_size(n, k),)))
        check_scaled_operands(_WHO, a, b, k, out_dtype, scales, block=MX_SCALE_BLOCK, scale_dtype=SCALE_DTYPE)
        return m, n, k
    blocks = k // SCALE_BLOCK
    check_scaled_operands(
        _WHO,
        a,
        b,
        k,
        out_dtype,
        (("scale_a", scale_a, (blocks, m)), ("scale_b", scale_b, (blocks, -(-n // SCALE_BLOCK)))),
    )
    return m, n, k


def scaled_gemm_call(m: int, n: int, k: int, dtype, out_dtype, mx: bool = False) -> Call:
    """The Call of a block-scaled GEMM (A and B K-major); `mx`: MXFP8 scales."""
    name = MX_DTYPE if mx else dtype_name(dtype)
    return Call("dense", m, n, k, 1, "k", "k", name, dtype_name(out_dtype))


def scaled_gemm(a, b, scale_a, scale_b, *, out_dtype=jnp.bfloat16, plan: Plan | None = None, device=None):
    """Binds the block-scaled GEMM with `plan`, or with a fresh plan (the
    planner's kernel row, or the float32 fallback with the same semantics)."""
    m, n, k = _check(a, b, scale_a, scale_b, out_dtype)
    out_dtype = np.dtype(out_dtype)
    plan = plans.choose(scaled_gemm_call(m, n, k, a.dtype, out_dtype, is_mx_scale(scale_a)), plan, device, _WHO)
    return scaled_gemm_local_p.bind(a, b, scale_a, scale_b, out_dtype=out_dtype, plan=plan)
