"""The block-scaled fp8 ops, their quantizations and the fp8 recipe on a mesh
of 8 CPU devices: each shard runs its own products on its own slices and
scales, planned for its local shape, with only the collectives a data- or
tensor-parallel layer needs. Plans are made for a described H200, so the
recipe binds the block-scaled ops (their CPU lowering is the float32
fallback with the kernels' semantics).

Like test_sharding.py, the file reruns itself in a subprocess on 8 host devices.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import compiled_text, put, rerun_on_8_host_devices
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_cluster
from jax_cluster import _ffi
from jax_cluster.ops.fp8_training import fp8_grouped, fp8_linear, fp8_weights
from jax_cluster.planning import tables
from jax_cluster.planning.device import DeviceInfo
from jax_cluster.primitives import mx_scales, plans
from jax_cluster.primitives.scaled_gemm import scaled_gemm
from jax_cluster.primitives.scaled_ragged import scaled_ragged_dot, scaled_ragged_k_dot
from jax_cluster.primitives.token_tile_quantize import quantize_token_tiles
from jax_cluster.primitives.weight_block_quantize import quantize_weight_blocks

EIGHT = jax.device_count() >= 8
needs_8 = pytest.mark.skipif(not EIGHT, reason="runs in the 8-device subprocess")
H200 = DeviceInfo("cuda", "described H200", (9, 0), 132, 232448, 50 << 20)
E4M3 = jnp.float8_e4m3fn
# the recipe binds the block-scaled ops only where the extension has their sm90a rows
BUILT_SCALED_ROWS = {
    v.problem
    for v in tables.load_menu()
    if v.dtype in tables.BLOCK_SCALED_DTYPES and v.arch == "sm90a" and v.name in _ffi.compiled_variant_names()
}
needs_rows = pytest.mark.skipif(
    not {"dense", "ragged_m", "ragged_k"} <= BUILT_SCALED_ROWS, reason="the extension has no block-scaled sm90a rows"
)


@pytest.mark.skipif(EIGHT, reason="already on 8 devices")
def test_runs_with_8_host_devices():
    rerun_on_8_host_devices(__file__)


@pytest.fixture
def mesh():
    return jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto, AxisType.Auto))


@pytest.fixture
def planned_calls(monkeypatch):
    """Plans made for an H200 wherever the code asks for one; the list of
    calls planned (the whole call first, then each shard's)."""
    calls, real = [], plans.fresh

    def fresh(call, device):
        calls.append(call)
        return real(call, H200)

    monkeypatch.setattr(plans, "fresh", fresh)
    return calls


def randn(key, shape, dtype=jnp.float32):
    return jax.random.normal(jax.random.key(key), shape, jnp.float32).astype(dtype)


def scales(key, shape):
    return jax.random.uniform(jax.random.key(key), shape, jnp.float32, 0.5, 2.0)


def assert_close(out, ref, rtol):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert out.shape == ref.shape and np.isfinite(out).all()
    assert np.linalg.norm(out - ref) <= rtol * np.linalg.norm(ref), np.linalg.norm(out - ref) / np.linalg.norm(ref)


def collectives(f, *args) -> tuple[int, int]:
    hlo = compiled_text(f, *args)
    return hlo.count("all-gather("), hlo.count("all-reduce(")


# --------------------------------------------------------------------------- the block-scaled GEMM

M, N, K = 256, 512, 1024
# (a, b, scale_a [K/128, M], scale_b [K/128, N/128]) specs, and whether K is summed
GEMM_CASES = {
    "m": (P("x", None), P(), P(None, "x"), P(), False),
    "n": (P(), P("y", None), P(), P(None, "y"), False),
    "k": (P(None, "y"), P(None, "y"), P("y", None), P("y", None), True),
    "m_and_k": (P("x", "y"), P(None, "y"), P("y", "x"), P("y", None), True),
}


@needs_8
@pytest.mark.parametrize("case", GEMM_CASES)
def test_the_scaled_gemm_runs_one_local_product_per_shard(mesh, planned_calls, case):
    *specs, summed = GEMM_CASES[case]
    operands = (
        randn(0, (M, K), E4M3),
        randn(1, (N, K), E4M3),
        scales(2, (K // 128, M)),
        scales(3, (K // 128, N // 128)),
    )
    f = jax.jit(lambda *xs: scaled_gemm(*xs, out_dtype=jnp.float32))
    whole = f(*operands)
    placed = [put(mesh, x, s) for x, s in zip(operands, specs)]
    planned_calls.clear()
    out = f(*placed)
    assert_close(out, whole, 1e-6)
    gathers, reduces = collectives(f, *placed)
    assert gathers == 0 and (reduces > 0) == summed
    local = {(c.m, c.n, c.k) for c in planned_calls}
    m, n, k = M // (2 if "m" in case else 1), N // (4 if case == "n" else 1), K // (4 if summed else 1)
    assert (m, n, k) in local, local


@needs_8
def test_mx_scales_split_with_the_rows_along_their_layout_tiles(mesh):
    """MX scales are one flat layout per operand, 128-row tiles outermost:
    M split in whole tiles takes each shard's tiles, no gather."""
    m, n, k = 256, 256, 256
    bits = jax.random.randint(jax.random.key(4), (m, k // 32), 120, 134).astype(jnp.uint8)
    bits_b = jax.random.randint(jax.random.key(5), (n, k // 32), 120, 134).astype(jnp.uint8)
    scale_a = mx_scales.to_kernel_layout(bits.view(mx_scales.SCALE_DTYPE), k)
    scale_b = mx_scales.to_kernel_layout(bits_b.view(mx_scales.SCALE_DTYPE), k)
    operands = (randn(6, (m, k), E4M3), randn(7, (n, k), E4M3), scale_a, scale_b)
    f = jax.jit(lambda *xs: scaled_gemm(*xs, out_dtype=jnp.float32))
    placed = [put(mesh, x, s) for x, s in zip(operands, (P("x", None), P(), P("x"), P()))]
    assert_close(f(*placed), f(*operands), 1e-6)
    assert collectives(f, *placed) == (0, 0)


# --------------------------------------------------------------------------- quantizations


@needs_8
@pytest.mark.parametrize("spec", [P("x", "y", None), P(None, "x", "y"), P(("x", "y"), None, None)])
def test_weight_blocks_quantize_each_shard_s_own_blocks(mesh, spec):
    w = randn(8, (8, 512, 512), jnp.bfloat16)
    f = jax.jit(lambda w: quantize_weight_blocks(w, E4M3))
    whole, sharded = f(w), f(put(mesh, w, spec))
    for got, want in zip(sharded, whole):
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    assert collectives(f, put(mesh, w, spec)) == (0, 0)


@needs_8
def test_token_tiles_split_row_blocks_and_columns(mesh):
    blocks, rows, groups = 8, 96, 3
    x = randn(9, (blocks * rows, 256), jnp.bfloat16)
    cuts = np.sort(np.random.default_rng(0).integers(0, rows + 1, (blocks, groups)), axis=1)
    sizes = jnp.asarray(np.diff(cuts, axis=1, prepend=0), jnp.int32)
    laid = 5 * 128  # padded_rows(96, 3)
    f = jax.jit(lambda x, s: quantize_token_tiles(x, s, laid, E4M3))
    whole = f(x, sizes)
    for xs, ss in ((P(("x", "y")), P(("x", "y"))), (P("x", "y"), P("x"))):
        args = put(mesh, x, xs), put(mesh, sizes, ss)
        for got, want in zip(f(*args), whole):
            np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
        assert collectives(f, *args) == (0, 0)
    # unsharded, each block is its own layout
    one = quantize_token_tiles(x[rows : 2 * rows], sizes[1], laid, E4M3)
    np.testing.assert_array_equal(np.asarray(whole[0][:, laid : 2 * laid], np.float32), np.asarray(one[0], np.float32))


@needs_8
@pytest.mark.parametrize("size", [1024, 700, 0])
def test_one_unpadded_group_splits_its_rows_along_tiles(mesh, size):
    """The dense weight gradient's layout (one group on exactly x's rows):
    each shard takes its part of the group's size."""
    x = randn(10, (1024, 256), jnp.bfloat16)
    sizes = jnp.asarray([size], jnp.int32)
    f = jax.jit(lambda x, s: quantize_token_tiles(x, s, 1024, E4M3))
    whole = f(x, sizes)
    args = put(mesh, x, P(("x", "y"), None)), sizes
    for got, want in zip(f(*args), whole):
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    assert collectives(f, *args) == (0, 0)


# --------------------------------------------------------------------------- the recipe


def _grads(layer):
    return jax.jit(jax.grad(lambda *xs: (layer(*xs).astype(jnp.float32) ** 2).sum(), (0, 1)))


# (x spec, weight spec, gathers allowed, all-reduces): x [1024, 512] . w [512, 768]
LINEAR_CASES = {
    "data": (P(("x", "y")), P(), 0, 1),  # only the weight gradient is summed
    "data_and_k": (P("x"), P("y", None), 0, 2),  # K split: the forward's partials too
}


@needs_8
@needs_rows
@pytest.mark.parametrize("case", LINEAR_CASES)
def test_the_dense_recipe_trains_sharded_without_gathering(mesh, planned_calls, case):
    xs, ws, gathers, reduces = LINEAR_CASES[case]
    x, w = randn(11, (1024, 512), jnp.bfloat16), randn(12, (512, 768), jnp.bfloat16)
    f = _grads(fp8_linear)
    assert "jax_cluster_scaled_gemm" in str(jax.make_jaxpr(f)(x, w))
    whole = f(x, w)
    args = put(mesh, x, xs), put(mesh, w, ws)
    planned_calls.clear()
    for got, want in zip(f(*args), whole):
        assert_close(np.asarray(got, np.float32), np.asarray(want, np.float32), 1e-2)
    assert collectives(f, *args) == (gathers, reduces)
    assert min(c.m for c in planned_calls) < 1024  # shards planned for their own rows


@needs_8
def test_a_weight_split_off_its_blocks_is_gathered_not_refused(mesh, planned_calls):
    """N = 768 on 4 devices is 192 columns a shard, across scale blocks: the
    propagation splits mesh axes into sub-axes there, which the rules take as
    replicated (the weight is gathered) rather than fail."""
    x, w = randn(13, (1024, 512), jnp.bfloat16), randn(14, (512, 768), jnp.bfloat16)
    f = _grads(fp8_linear)
    whole = f(x, w)
    for got, want in zip(f(put(mesh, x, P("x")), put(mesh, w, P(None, "y"))), whole):
        assert_close(np.asarray(got, np.float32), np.asarray(want, np.float32), 1e-2)


@needs_8
@needs_rows
@pytest.mark.parametrize("ahead", [False, True])
@pytest.mark.parametrize("w_spec", [P(), P(None, None, "y")])
def test_the_grouped_recipe_trains_token_blocks_sharded(mesh, planned_calls, w_spec, ahead):
    """[S, G] sizes with the tokens split S ways (data parallel), and the
    experts' N split too (tensor parallel): no gathers, the weight gradient
    summed over the data-parallel shards; with the weights quantized ahead
    (fp8_weights) as well, each shard quantizing its own blocks."""
    blocks, rows, groups = 8, 256, 4
    x, w = randn(15, (blocks * rows, 256), jnp.bfloat16), randn(16, (groups, 256, 512), jnp.bfloat16)
    cuts = np.sort(np.random.default_rng(1).integers(0, rows + 1, (blocks, groups)), axis=1)
    sizes = jnp.asarray(np.diff(cuts, axis=1, prepend=0), jnp.int32)

    def loss(x, w, s, q):
        return (fp8_grouped(x, w, s, "blockwise", E4M3, None, q).astype(jnp.float32) ** 2).sum()

    grads = jax.grad(loss, (0, 1))
    f = jax.jit(lambda x, w, s: grads(x, w, s, fp8_weights(w) if ahead else None))
    assert "jax_cluster_scaled_ragged_dot" in str(jax.make_jaxpr(f)(x, w, sizes))
    whole = jax.jit(lambda x, w, s: grads(x, w, s, None))(x, w, sizes)
    spec = P(("x", "y")) if w_spec == P() else P("x")
    args = put(mesh, x, spec), put(mesh, w, w_spec), put(mesh, sizes, spec)
    for got, want in zip(f(*args), whole):
        assert_close(np.asarray(got, np.float32), np.asarray(want, np.float32), 1e-2)
    gathers, reduces = collectives(f, *args)
    assert gathers == 0 and reduces >= 1
    assert all(c.m == rows for c in planned_calls if c.problem == "ragged_m")  # one block each


@needs_8
@needs_rows
def test_the_recipe_s_summed_partials_stay_on_the_kernels(mesh, planned_calls, monkeypatch):
    """The fp8 grouped kernels write bf16 only: the data-parallel weight
    gradient's per-shard partials are planned in bf16 and added in float32,
    not sent to XLA's path as float32 products (compiled, not run)."""
    made, real = [], plans.for_partials

    def partials(*args):
        plan, dtype = real(*args)
        made.append(plan)
        return plan, dtype

    monkeypatch.setattr(plans, "for_partials", partials)
    spec = NamedSharding(mesh, P(("x", "y")))
    x = jax.ShapeDtypeStruct((8 * 2048, 2048), jnp.bfloat16, sharding=spec)
    w = jax.ShapeDtypeStruct((8, 2048, 2048), jnp.bfloat16, sharding=NamedSharding(mesh, P()))
    sizes = jax.ShapeDtypeStruct((8, 8), jnp.int32, sharding=spec)
    jax.jit(jax.grad(lambda x, w, s: (fp8_grouped(x, w, s).astype(jnp.float32) ** 2).sum(), (0, 1))).lower(
        x, w, sizes
    ).compile()
    assert made and all(p.uses_kernel and p.call.problem == "ragged_k" for p in made), [p.reason for p in made]


@needs_8
def test_one_scale_block_or_one_row_block_still_shards(mesh, planned_calls):
    """A dimension of exactly one scale block (K = 128) or one row block
    ([1, G] sizes) makes a factor of size 1, which a compound factor of the
    sharding rule must leave out."""
    x, w = randn(17, (1024, 128), jnp.bfloat16), randn(18, (128, 256), jnp.bfloat16)
    f = _grads(fp8_linear)
    for got, want in zip(f(put(mesh, x, P(("x", "y"))), w), f(x, w)):
        assert_close(np.asarray(got, np.float32), np.asarray(want, np.float32), 1e-2)
    rows, groups = randn(19, (512, 256), jnp.bfloat16), jnp.asarray([[100, 300, 112]], jnp.int32)
    experts = randn(20, (3, 256, 384), jnp.bfloat16)
    g = jax.jit(jax.grad(lambda x, w, s: (jax_cluster.ragged_dot(x, w, s).astype(jnp.float32) ** 2).sum(), (0, 1)))
    sharded = g(put(mesh, rows, P(None, "y")), put(mesh, experts, P(None, "y", None)), groups)
    for got, want in zip(sharded, g(rows, experts, groups)):
        assert_close(np.asarray(got, np.float32), np.asarray(want, np.float32), 1e-2)


@needs_8
def test_mx_row_blocks_split_with_their_scale_layouts(mesh):
    """MXFP8 grouped calls with [S, G] sizes: each block's A scales (ragged_m)
    or both operands' scales (ragged_k) are a flat layout of their own, one
    after another, so the blocks split with them; ragged_k sums the shards."""
    blocks, rows, k, n, groups = 8, 128, 256, 256, 4
    cuts = np.sort(np.random.default_rng(2).integers(0, rows + 1, (blocks, groups)), axis=1)
    sizes = jnp.asarray(np.diff(cuts, axis=1, prepend=0), jnp.int32)

    def e8m0(key, size):
        return jax.random.randint(jax.random.key(key), (size,), 120, 134).astype(jnp.uint8).view(mx_scales.SCALE_DTYPE)

    spread = P(("x", "y"))
    forward = (
        (randn(21, (blocks * rows, k), E4M3), spread),
        (randn(22, (groups, n, k), E4M3), P()),
        (e8m0(23, blocks * mx_scales.grouped_layout_size(rows, groups, k)), spread),
        (jnp.stack([e8m0(24 + g, mx_scales.layout_size(n, k)) for g in range(groups)]), P()),
        (sizes, spread),
    )
    laid = 5 * 128  # token_tiles.padded_rows(128, 4)
    weight_gradient = (
        (randn(30, (k, blocks * laid), E4M3), P(None, ("x", "y"))),
        (randn(31, (n, blocks * laid), E4M3), P(None, ("x", "y"))),
        (e8m0(32, blocks * mx_scales.layout_size(k, laid)), spread),
        (e8m0(33, blocks * mx_scales.layout_size(n, laid)), spread),
        (sizes, spread),
    )
    for op, operands, reduces in ((scaled_ragged_dot, forward, False), (scaled_ragged_k_dot, weight_gradient, True)):
        f = jax.jit(lambda *xs, op=op: op(*xs, out_dtype=jnp.float32))
        placed = [put(mesh, x, s) for x, s in operands]
        assert_close(f(*placed), f(*(x for x, _ in operands)), 1e-6)
        gathers, all_reduces = collectives(f, *placed)
        assert gathers == 0 and (all_reduces > 0) == reduces
