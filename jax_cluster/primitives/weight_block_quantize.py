"""A stack of weights quantized into DeepSeek-V3's 128 x 128 blocks in both
layouts the fp8 recipe reads, as one primitive: w [G, K, N] ->
(values_kn [G, K, N], values_nk [G, N, K], scales [G, K/128, N/128]).
The block-scaled kernels read B K-major, so the forward product (contracted
over K) takes values_nk and the input gradient (contracted over N)
values_kn; both share the blocks' float32 scales (primitives/fp8_scaling.py:
amax times the float32 reciprocal of the format's largest value, 1 for an
all-zero block).

On CUDA with `use_kernel` it is one kernel (kernels/weight_block_quantize.cu:
one read of w, two bytes written per value); elsewhere, and where the
kernel does not take the call (another input dtype), XLA computes the same
numbers as an amax reduction and a scaling pass per layout.

Over a mesh the groups split, and K and N along whole 128 x 128 blocks:
each shard quantizes its own blocks, with no collective.
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import batching, mlir
from jax.sharding import NamedSharding

from jax_cluster import _ffi
from jax_cluster.planning.tables import FFI_TARGETS, SCALE_BLOCK
from jax_cluster.primitives import fp8_scaling
from jax_cluster.primitives.registry import local_primitive, partitioned_primitive
from jax_cluster.primitives.specs import choose_axes, dim_axes, rule_options, spec_of, tied

# Whether calls take the kernel unless told, where the device runs its
# machine code (kernel_by_default). On the H200 it wrote XLA's form's bytes
# and ran 1.18-1.32x faster on every stack measured
# (benchmarks/bench_fp8_weights.py, results/h200/fp8_weights.json).
KERNEL_BY_DEFAULT = True
_default_override: list[bool] = []  # kernel_default_as's stack


@contextlib.contextmanager
def kernel_default_as(use_kernel: bool):
    """Calls traced inside the block that do not say take `use_kernel` where
    the device runs the kernel: how a benchmark times a layer both ways in
    one process."""
    _default_override.append(bool(use_kernel))
    try:
        yield
    finally:
        _default_override.pop()


def _abstract_eval(w, *, dtype, use_kernel):
    groups, k, n = w.shape
    return (
        jax.core.ShapedArray((groups, k, n), dtype),
        jax.core.ShapedArray((groups, n, k), dtype),
        jax.core.ShapedArray((groups, k // SCALE_BLOCK, n // SCALE_BLOCK), jnp.float32),
    )


def xla_weight_blocks(w, *, dtype, use_kernel=False):
    """The portable form: one amax per block, then each layout's values."""
    groups, k, n = w.shape
    blocks = w.astype(jnp.float32).reshape(groups, k // SCALE_BLOCK, SCALE_BLOCK, n // SCALE_BLOCK, SCALE_BLOCK)
    scales = fp8_scaling.block_scales(jnp.max(jnp.abs(blocks), axis=(2, 4)), dtype)
    values = fp8_scaling.scaled_values(blocks, (1.0 / scales)[:, :, None, :, None], dtype)
    values_kn = values.reshape(groups, k, n)
    return values_kn, values_kn.transpose(0, 2, 1), scales


MAX_GRID_Y_Z = 65535  # CUDA's limit on a grid's y and z: K's blocks and the groups


def kernel_takes(w, dtype) -> bool:
    """Whether the kernel takes w [G, K, N] into `dtype` values in one launch."""
    return (
        w.ndim == 3
        and w.shape[1] % SCALE_BLOCK == 0
        and w.shape[2] % SCALE_BLOCK == 0
        and w.shape[0] <= MAX_GRID_Y_Z
        and w.shape[1] // SCALE_BLOCK <= MAX_GRID_Y_Z
        and fp8_scaling.kernel_formats(w.dtype, dtype)
    )


def kernel_by_default(device=None) -> bool:
    """KERNEL_BY_DEFAULT (or kernel_default_as's value) on a device (default:
    the first) that runs the kernel's machine code
    (fp8_scaling.device_runs_kernels); elsewhere XLA's form."""
    wanted = _default_override[-1] if _default_override else KERNEL_BY_DEFAULT
    return wanted and fp8_scaling.device_runs_kernels(device)


def _cuda_lowering(ctx, w, *, dtype, use_kernel):
    if not (use_kernel and kernel_takes(ctx.avals_in[0], dtype) and _ffi.register_targets()):
        fallback = functools.partial(xla_weight_blocks, dtype=dtype)
        return mlir.lower_fun(fallback, multiple_results=True)(ctx, w)
    return jax.ffi.ffi_lowering(FFI_TARGETS["quantize_weight_blocks"])(ctx, w)


quantize_weight_blocks_local_p = local_primitive(
    "jax_cluster_quantize_weight_blocks_local",
    abstract_eval=_abstract_eval,
    xla_impl=xla_weight_blocks,
    cuda_lowering=_cuda_lowering,
    multiple_results=True,
)


def _whole(w, dtype, use_kernel):
    return tuple(quantize_weight_blocks_local_p.bind(w, dtype=dtype, use_kernel=use_kernel))


def _sharding_rule(dtype, use_kernel, mesh, operand_types, result_types):
    _, k, n = operand_types[0].shape
    rows_k, kb, sizes_k, keep_k = tied("k", k, SCALE_BLOCK)
    cols_n, nb, sizes_n, keep_n = tied("n", n, SCALE_BLOCK)
    rule = f"g {rows_k} {cols_n} -> g {rows_k} {cols_n}, g {cols_n} {rows_k}, g {kb} {nb}"
    return rule, rule_options(rule, replication=keep_k + keep_n, sizes={**sizes_k, **sizes_n})


def _partition(dtype, use_kernel, mesh, arg_shapes, result_shape):
    (w,) = arg_shapes
    groups, k, n = w.shape
    on_g, on_k, on_n = dim_axes(w)
    extents = {"g": groups, "k": k // SCALE_BLOCK, "n": n // SCALE_BLOCK}
    chosen = choose_axes(mesh, [("g", on_g), ("k", on_k), ("n", on_n)], extents)

    def per_shard(w):
        return _whole(w, dtype, use_kernel)

    def sharding(*names):
        return NamedSharding(mesh, spec_of(names, chosen))

    outs = (sharding("g", "k", "n"), sharding("g", "n", "k"), sharding("g", "k", "n"))
    return mesh, per_shard, outs, (sharding("g", "k", "n"),)


def _batch_rule(args, dims, **params):
    """A vmapped stack is more groups: [B, G, K, N] binds as [B*G, K, N]."""
    (w,), (dim,) = args, dims
    w = batching.bdim_at_front(w, dim, w.shape[dim])
    size, groups = w.shape[:2]
    outs = quantize_weight_blocks_p.bind(w.reshape(size * groups, *w.shape[2:]), **params)
    return [o.reshape(size, groups, *o.shape[1:]) for o in outs], [0, 0, 0]


quantize_weight_blocks_p = partitioned_primitive(
    "jax_cluster_quantize_weight_blocks",
    static=("dtype", "use_kernel"),
    abstract_eval=_abstract_eval,
    whole=_whole,
    partition=_partition,
    sharding_rule=_sharding_rule,
    batch_rule=_batch_rule,
    multiple_results=True,
)


def quantize_weight_blocks(w, dtype, *, use_kernel: bool | None = None):
    """(values_kn [G, K, N], values_nk [G, N, K], scales [G, K/128, N/128])
    of w [G, K, N] (bf16, f16 or f32; K and N multiples of 128) in `dtype`
    (float8_e4m3fn or float8_e5m2). `use_kernel`: None takes kernel_by_default()."""
    if w.ndim != 3 or w.shape[1] % SCALE_BLOCK or w.shape[2] % SCALE_BLOCK:
        raise ValueError(
            f"quantize_weight_blocks: w must be [G, K, N] with K and N multiples of {SCALE_BLOCK}, got {w.shape}"
        )
    if jnp.dtype(dtype) not in fp8_scaling.KERNEL_OUTPUTS:
        raise TypeError(f"quantize_weight_blocks: dtype must be float8_e4m3fn or float8_e5m2, got {dtype}")
    use = kernel_by_default() if use_kernel is None else bool(use_kernel)
    return quantize_weight_blocks_p.bind(w, dtype=np.dtype(dtype), use_kernel=use)
