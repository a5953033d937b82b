"""jax_cluster.ragged_dot on the fallback path (CPU): semantics against a
float64 reference, the group-size rule, autodiff, vmap, jit, errors, and the
planner's choices on described devices."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import group_bounds, ragged_k_reference, ragged_reference, randn, rel_error, tolerance
from jax import lax

import jax_cluster
from jax_cluster import _ffi
from jax_cluster.planning import cost_model, tables
from jax_cluster.planning.device import DeviceInfo
from jax_cluster.primitives.ragged import ragged

H200 = DeviceInfo("cuda", "described H200", (9, 0), 132, 232448, 50 << 20)
B200 = DeviceInfo("cuda", "described B200", (10, 0), 148, 232448, 126 << 20)
F32_TOL = 1e-5


def compiled_ragged_row(problem, arch="sm90a"):
    return any(
        v.problem == problem and v.arch == arch and v.name in _ffi.compiled_variant_names() for v in tables.load_menu()
    )


def _spread(rows, groups, empty_every=0):
    """Random sizes of `groups` groups summing to `rows`; every `empty_every`-th one empty."""
    weights = np.random.rand(groups) + 0.05
    if empty_every:
        weights[::empty_every] = 0
    sizes = np.floor(weights / weights.sum() * rows).astype(np.int32)
    sizes[np.argmax(weights)] += rows - sizes.sum()
    return sizes


# (name, M, K, N, group sizes); sizes not summing to M exercise the documented rule
CASES = [
    ("uniform", 64, 16, 24, [16, 16, 16, 16]),
    ("empty groups", 40, 16, 24, [0, 10, 0, 0, 30, 0]),
    ("one-row groups", 20, 8, 16, [1] * 20),
    ("all in one group", 32, 16, 8, [0, 0, 32, 0]),
    ("G=256", 300, 16, 8, _spread(300, 256, empty_every=3)),
    ("sum < M", 50, 8, 8, [10, 5, 7]),
    ("sum > M", 30, 8, 8, [20, 15, 10]),
    ("negative sizes", 30, 8, 8, [-4, 12, -1, 9, 5]),
    ("sizes near int32 max", 16, 8, 8, [2**31 - 1, 5, 2**31 - 1]),
    ("odd K and N", 33, 13, 7, [11, 0, 22]),
]
IDS = [c[0] for c in CASES]


def _operands(m, k, n, groups, rhs_layout, dtype=jnp.float32):
    lhs = randn((m, k), dtype)
    rhs = randn((groups, k, n) if rhs_layout == "gkn" else (groups, n, k), dtype)
    return lhs, rhs


@pytest.mark.parametrize("rhs_layout", ["gkn", "gnk"])
@pytest.mark.parametrize("name,m,k,n,sizes", CASES, ids=IDS)
def test_matches_float64_reference(name, m, k, n, sizes, rhs_layout):
    lhs, rhs = _operands(m, k, n, len(sizes), rhs_layout)
    gs = jnp.asarray(sizes, jnp.int32)
    out = jax_cluster.ragged_dot(lhs, rhs, gs, rhs_layout=rhs_layout)
    ref = ragged_reference(lhs, rhs, sizes, rhs_layout)
    assert out.shape == (m, n) and out.dtype == jnp.float32
    assert rel_error(out, ref) < F32_TOL
    covered = group_bounds(sizes, m)[-1][1]
    if name in ("sum < M", "negative sizes"):
        assert covered < m  # these cases must leave a tail to check
    assert np.all(np.asarray(out)[covered:] == 0), "rows past the last group must be zero"


def test_bf16_inputs_and_preferred_element_type():
    lhs, rhs = _operands(48, 32, 16, 3, "gkn", jnp.bfloat16)
    gs = jnp.array([20, 0, 20], jnp.int32)
    ref = ragged_reference(lhs, rhs, gs)
    out = jax_cluster.ragged_dot(lhs, rhs, gs)
    assert out.dtype == jnp.bfloat16 and rel_error(out, ref) < tolerance(jnp.bfloat16)
    out = jax_cluster.ragged_dot(lhs, rhs, gs, preferred_element_type=jnp.float32)
    assert out.dtype == jnp.float32 and rel_error(out, ref) < F32_TOL


def test_mixed_input_dtypes_promote():
    lhs, rhs = randn((8, 8), jnp.bfloat16), randn((2, 8, 8), jnp.float32)
    out = jax_cluster.ragged_dot(lhs, rhs, jnp.array([3, 5], jnp.int32))
    assert out.dtype == jnp.float32


@pytest.mark.parametrize("sizes", [[0, 10, 0, 30], [5, -3, 50, 7], [], [40]], ids=str)
def test_ragged_k_problem(sizes):
    """The d_rhs product on its own: out[g] = a[rows g]^T b[rows g], empty groups zero."""
    a, b = randn((40, 16), jnp.float32), randn((40, 24), jnp.float32)
    gs = jnp.asarray(sizes, jnp.int32).reshape(len(sizes))
    out = ragged(a, b, gs, problem="ragged_k")
    ref = ragged_k_reference(a, b, sizes)
    assert out.shape == (len(sizes), 16, 24)
    if sizes:
        assert rel_error(out, ref) < F32_TOL
    for g, (lo, hi) in enumerate(group_bounds(sizes, 40)):
        if lo == hi:
            assert np.all(np.asarray(out[g]) == 0)


def test_no_groups_gives_zeros():
    out = jax_cluster.ragged_dot(randn((6, 8), jnp.float32), jnp.zeros((0, 8, 4)), jnp.zeros((0,), jnp.int32))
    assert out.shape == (6, 4) and np.all(np.asarray(out) == 0)


# --------------------------------------------------------------------------- autodiff


def _lax_loss(rhs_layout, ct):
    def loss(lhs, rhs, gs):
        w = rhs if rhs_layout == "gkn" else jnp.swapaxes(rhs, 1, 2)
        out = lax.ragged_dot(lhs, w, gs, precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
        return (out * ct).sum()

    return loss


def _our_loss(rhs_layout, ct, **kw):
    def loss(lhs, rhs, gs):
        out = jax_cluster.ragged_dot(lhs, rhs, gs, rhs_layout=rhs_layout, **kw)
        return (out.astype(jnp.float32) * ct).sum()

    return loss


@pytest.mark.parametrize("rhs_layout", ["gkn", "gnk"])
@pytest.mark.parametrize("sizes", [[10, 0, 1, 20, 0], [3, 3, 3, 3, 3], [0, 0, 40, 0, 0]], ids=str)
def test_gradients_match_lax_ragged_dot(sizes, rhs_layout):
    m, k, n = 40, 16, 24
    lhs, rhs = _operands(m, k, n, len(sizes), rhs_layout)
    gs = jnp.asarray(sizes, jnp.int32)
    ct = randn((m, n), jnp.float32)
    got = jax.grad(_our_loss(rhs_layout, ct), argnums=(0, 1))(lhs, rhs, gs)
    want = jax.grad(_lax_loss(rhs_layout, ct), argnums=(0, 1))(lhs, rhs, gs)
    for g, w in zip(got, want):
        assert g.shape == w.shape and rel_error(g, w) < F32_TOL


@pytest.mark.parametrize("rhs_layout", ["gkn", "gnk"])
def test_gradients_follow_the_size_rule(rhs_layout):
    """Negative and overflowing sizes: the same gradients as lax on the clamped sizes."""
    m, k, n, sizes = 30, 8, 16, [-4, 12, -1, 25, 6]
    clamped = [hi - lo for lo, hi in group_bounds(sizes, m)]
    lhs, rhs = _operands(m, k, n, len(sizes), rhs_layout)
    ct = randn((m, n), jnp.float32)
    got = jax.grad(_our_loss(rhs_layout, ct), argnums=(0, 1))(lhs, rhs, jnp.array(sizes, jnp.int32))
    want = jax.grad(_lax_loss(rhs_layout, ct), argnums=(0, 1))(lhs, rhs, jnp.array(clamped, jnp.int32))
    for g, w in zip(got, want):
        assert rel_error(g, w) < F32_TOL
    assert np.all(np.asarray(got[1])[[0, 2, 4]] == 0), "groups without rows get zero gradient"


def test_bf16_gradients_with_f32_output():
    lhs, rhs = _operands(32, 16, 16, 3, "gkn", jnp.bfloat16)
    gs = jnp.array([8, 0, 20], jnp.int32)
    ct = randn((32, 16), jnp.float32)
    dl, dr = jax.grad(_our_loss("gkn", ct, preferred_element_type=jnp.float32), argnums=(0, 1))(lhs, rhs, gs)
    assert dl.dtype == dr.dtype == jnp.bfloat16
    want = jax.grad(_lax_loss("gkn", ct), argnums=(0, 1))(lhs.astype(jnp.float32), rhs.astype(jnp.float32), gs)
    for g, w in zip((dl, dr), want):
        assert rel_error(g, w) < 2 * tolerance(jnp.bfloat16)


def _masked_einsum(sizes, rows):
    """A differentiable-to-any-order dense reference: a 0/1 mask per group."""
    mask = np.zeros((len(sizes), rows), np.float32)
    for g, (lo, hi) in enumerate(group_bounds(sizes, rows)):
        mask[g, lo:hi] = 1
    return lambda l, r: jnp.einsum("gm,mk,gkn->mn", mask, l, r, precision="highest")


def test_jvp_and_second_order():
    lhs, rhs = _operands(24, 8, 8, 3, "gkn")
    gs = jnp.array([5, 0, 15], jnp.int32)
    tl, tr = randn(lhs.shape, jnp.float32), randn(rhs.shape, jnp.float32)
    ours = lambda l, r: jax_cluster.ragged_dot(l, r, gs)
    theirs = lambda l, r: lax.ragged_dot(l, r, gs, precision=lax.Precision.HIGHEST)
    _, got = jax.jvp(ours, (lhs, rhs), (tl, tr))
    _, want = jax.jvp(theirs, (lhs, rhs), (tl, tr))
    assert rel_error(got, want) < F32_TOL
    # the gradient of d_rhs (a ragged_k product) with respect to lhs; lax has no
    # transpose of its ragged contraction, so the reference is a masked einsum
    second = lambda f: jax.grad(lambda l, r: jnp.sum(jax.grad(lambda r: (f(l, r) ** 2).sum())(r) ** 2))(lhs, rhs)
    assert rel_error(second(ours), second(_masked_einsum(gs, 24))) < 1e-4


# --------------------------------------------------------------------------- vmap and jit


def test_vmap_over_lhs_only():
    lhs, rhs = randn((3, 20, 8), jnp.float32), randn((4, 8, 16), jnp.float32)
    gs = jnp.array([5, 0, 9, 3], jnp.int32)
    out = jax.vmap(jax_cluster.ragged_dot, (0, None, None))(lhs, rhs, gs)
    for i in range(3):
        assert rel_error(out[i], ragged_reference(lhs[i], rhs, gs)) < F32_TOL


def test_vmap_over_everything_with_per_item_sizes():
    lhs = randn((2, 20, 8), jnp.float32)
    rhs = randn((4, 16, 8, 2), jnp.float32)  # [G,N,K] mapped on its last axis
    gs = jnp.array([[5, 0, 9, 3], [0, 20, 0, -1]], jnp.int32)
    f = lambda l, r, g: jax_cluster.ragged_dot(l, r, g, rhs_layout="gnk")
    out = jax.jit(jax.vmap(f, (0, 3, 0)))(lhs, rhs, gs)
    for i in range(2):
        assert rel_error(out[i], ragged_reference(lhs[i], rhs[..., i], gs[i], "gnk")) < F32_TOL


def test_grad_of_vmap():
    lhs, rhs = randn((2, 12, 8), jnp.float32), randn((3, 8, 8), jnp.float32)
    gs = jnp.array([4, 0, 8], jnp.int32)
    loss = lambda f: lambda l, r: jnp.sum(jax.vmap(f, (0, None, None))(l, r, gs) ** 2)
    theirs = lambda l, r, g: _masked_einsum(gs, 12)(l, r)  # lax cannot vmap this
    got = jax.grad(loss(jax_cluster.ragged_dot), argnums=(0, 1))(lhs, rhs)
    want = jax.grad(loss(theirs), argnums=(0, 1))(lhs, rhs)
    for g, w in zip(got, want):
        assert rel_error(g, w) < F32_TOL


def test_jit_traces_once_for_changing_sizes():
    traces = []

    @jax.jit
    def f(lhs, rhs, gs):
        traces.append(1)
        return jax_cluster.ragged_dot(lhs, rhs, gs)

    lhs, rhs = randn((32, 8), jnp.float32), randn((4, 8, 8), jnp.float32)
    for sizes in ([8, 8, 8, 8], [0, 32, 0, 0], [1, 2, 3, 4], [-1, 40, 0, 0]):
        out = f(lhs, rhs, jnp.array(sizes, jnp.int32))
        assert rel_error(out, ragged_reference(lhs, rhs, sizes)) < F32_TOL
    assert len(traces) == 1


# --------------------------------------------------------------------------- errors


def spec(shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


@pytest.mark.parametrize(
    "lhs,rhs,gs,kw,error,message",
    [
        ((8, 4), (2, 4, 6), spec((2, 1, 1), jnp.int32), {}, ValueError, r"\[G\] or \[S,G\]"),
        ((9, 4), (2, 4, 6), spec((2, 2), jnp.int32), {}, ValueError, "multiple"),
        ((8, 4), (2, 4, 6), spec((2,), jnp.float32), {}, TypeError, "integer dtype"),
        ((8, 4), (3, 4, 6), spec((2,), jnp.int32), {}, ValueError, "3 groups but group_sizes has 2"),
        ((8, 4), (2, 5, 6), spec((2,), jnp.int32), {}, ValueError, "contracting dimensions differ"),
        ((8, 4), (2, 4, 6), spec((2,), jnp.int32), dict(rhs_layout="gnk"), ValueError, r"\(gnk\) has K=6"),
        ((8, 4), (2, 4, 6), spec((2,), jnp.int32), dict(rhs_layout="kn"), ValueError, "rhs_layout"),
        ((2, 8, 4), (2, 4, 6), spec((2,), jnp.int32), {}, ValueError, "lhs must be"),
        ((8, 4), (4, 6), spec((2,), jnp.int32), {}, ValueError, "lhs must be"),
    ],
)
def test_clear_errors_at_trace_time(lhs, rhs, gs, kw, error, message):
    with pytest.raises(error, match=message):
        jax.eval_shape(lambda l, r, g: jax_cluster.ragged_dot(l, r, g, **kw), spec(lhs), spec(rhs), gs)


def test_integer_operands_compute_as_lax_does():
    out = jax.eval_shape(
        jax_cluster.ragged_dot, spec((8, 4), jnp.int32), spec((2, 4, 6), jnp.int32), spec((2,), jnp.int32)
    )
    assert out.shape == (8, 6) and out.dtype == jnp.int32


def test_plans_for_other_problems_are_rejected():
    gs = spec((2,), jnp.int32)
    p = jax_cluster.plan_ragged(16, 6, 4, 2, problem="ragged_m", dtype=jnp.bfloat16)
    with pytest.raises(ValueError, match="made for ragged_m M=16 .* this call is ragged_m M=8"):
        jax.eval_shape(lambda l, r, g: jax_cluster.ragged_dot(l, r, g, plan=p), spec((8, 4)), spec((2, 4, 6)), gs)
    dense = jax_cluster.plan(8, 6, 4, dtype=jnp.bfloat16)
    with pytest.raises(ValueError, match="plan was made for dense"):
        jax.eval_shape(lambda l, r, g: jax_cluster.ragged_dot(l, r, g, plan=dense), spec((8, 4)), spec((2, 4, 6)), gs)
    q = jax_cluster.plan_ragged(8, 6, 4, 1, problem="ragged_m", dtype=jnp.bfloat16)
    with pytest.raises(ValueError, match="cannot run a dense GEMM"):
        jax.eval_shape(lambda a, b: jax_cluster.matmul(a, b, plan=q), spec((8, 4)), spec((4, 6)))


def test_explicit_plan_is_used():
    p = jax_cluster.plan_ragged(16, 8, 8, 2, problem="ragged_m", dtype=jnp.float32)
    lhs, rhs = randn((16, 8), jnp.float32), randn((2, 8, 8), jnp.float32)
    out = jax_cluster.ragged_dot(lhs, rhs, jnp.array([6, 10], jnp.int32), plan=p)
    assert rel_error(out, ragged_reference(lhs, rhs, [6, 10])) < F32_TOL


# --------------------------------------------------------------------------- planner


@pytest.mark.parametrize("problem,b_major", [("ragged_m", "n"), ("ragged_m", "k"), ("ragged_k", "n")])
def test_h200_plan_picks_a_compiled_ragged_row(problem, b_major):
    if not compiled_ragged_row(problem):
        pytest.skip(f"the extension has no compiled sm90a {problem} row")
    p = jax_cluster.plan_ragged(4096, 2048, 1024, 8, problem=problem, dtype=jnp.bfloat16, b_major=b_major, device=H200)
    v = {v.name: v for v in tables.load_menu()}[p.variant]
    assert p.path == "kernel" and v.problem == problem == p.problem and p.groups == 8
    assert (p.a_major, p.b_major) == (v.a_major, v.b_major) == ("k" if problem == "ragged_m" else "m", b_major)
    assert (p.schedule, p.raster, p.swizzle, p.splits) == ("dynamic", "along_m", 1, 1)
    assert p.residency == "modelled" and p.max_active_clusters == 132 // v.cluster_size
    assert "8 groups" in p.reason and p.notes and p.workspace_bytes >= 0
    assert 0 < p.predicted_efficiency <= 1
    text = p.explain()
    assert "groups=8" in text and "over the tiles of 8 groups" in text


def _decode_rows_compiled() -> bool:
    names = _ffi.compiled_variant_names() if _ffi.with_kernels() else ()
    return any(
        v.arch == "sm90a" and v.problem == "ragged_m" and v.tile_n <= 64 and v.name in names for v in tables.load_menu()
    )


@pytest.mark.skipif(not _decode_rows_compiled(), reason="the extension has no compiled narrow sm90a grouped row")
@pytest.mark.parametrize("b_major", ["k"])  # B [G,K,N] calls of this size take the CUDA-core decode rows
def test_decode_takes_the_narrow_tile_only_where_few_groups_leave_sms_idle(b_major):
    plan = lambda m, n, k, g, **kw: jax_cluster.plan_ragged(  # noqa: E731
        m, n, k, g, problem="ragged_m", dtype=jnp.bfloat16, b_major=b_major, device=H200, **kw
    )
    menu = {v.name: v for v in tables.load_menu()}
    stream = lambda p, m, n, k, g: cost_model.grouped_memory_time(  # noqa: E731
        menu[p.variant], m, n, k, g, 132, "bf16", "bf16", H200
    )
    # 8 rows on at most 8 of 64 experts: 32 wide tiles leave 100 SMs idle,
    # 128 narrow ones stream the same weights on four times the CTAs
    decode = plan(8, 1024, 2048, 64)
    assert decode.memory_bound and decode.tile_n == 64 and "memory-bound" in decode.reason
    assert "counting the weights of min(G, M) = 8 groups" in decode.explain()
    wide = plan(8, 1024, 2048, 64, tile=(128, 256, 64))
    assert wide.tile_n == 256 and stream(decode, 8, 1024, 2048, 64) < stream(wide, 8, 1024, 2048, 64)
    # more groups, or wider layers: the narrow tiles run in waves at half the
    # wide tile's pull rate, so the wide tile stays (DeepSeek-V3's gate at 8 and
    # 64 rows, OLMoE's at 64, Mixtral's at 8)
    for shape in ((8, 2048, 7168, 256), (64, 2048, 7168, 256), (64, 1024, 2048, 64), (8, 14336, 4096, 8)):
        p = plan(*shape)
        assert p.memory_bound and p.tile_n == 256, (shape, p.variant)
    # compute-bound calls are not memory-bound
    for shape in ((4096, 2048, 1024, 8), (16384, 14336, 4096, 8), (65536, 512, 1536, 40), (2048, 14336, 4096, 8)):
        p = plan(*shape)
        assert not p.memory_bound and p.tile_n == 256, (shape, p.variant)


@pytest.mark.parametrize("problem,b_major", [("ragged_m", "n"), ("ragged_m", "k"), ("ragged_k", "n")])
def test_b200_plan_picks_the_clc_grouped_row(problem, b_major):
    if not compiled_ragged_row(problem, "sm100f"):
        pytest.skip(f"the extension has no compiled sm100f {problem} row")
    p = jax_cluster.plan_ragged(4096, 2048, 1024, 8, problem=problem, dtype=jnp.bfloat16, b_major=b_major, device=B200)
    v = {v.name: v for v in tables.load_menu()}[p.variant]
    assert p.path == "kernel" and p.arch == "sm100f" and v.kind == "2sm_grouped_clc"
    assert v.problem == problem and (p.a_major, p.b_major) == (v.a_major, v.b_major)
    assert (p.schedule, p.mma, p.cluster_m, p.cluster_n) == ("clc", "2cta", 2, 1)
    assert p.max_active_clusters == 148 // 2 and "clc schedule" in p.reason
    assert p.workspace_bytes > 0  # per-group arrays, tile_start, a descriptor copy per CTA
    text = p.explain()
    assert "Cluster Launch Control" in text and "tile_start" in text
    assert "clc: each cluster takes the next tile of any group" in text
    # the same problem on Hopper keeps its work-queue row
    if compiled_ragged_row(problem):
        h = jax_cluster.plan_ragged(
            4096, 2048, 1024, 8, problem=problem, dtype=jnp.bfloat16, b_major=b_major, device=H200
        )
        assert h.arch == "sm90a" and h.schedule == "dynamic" and "dynamic schedule" in h.reason
        assert "Cluster Launch Control" not in h.explain()


@pytest.mark.skipif(
    not compiled_ragged_row("ragged_m", "sm100f"), reason="the extension has no compiled sm100f ragged_m row"
)
def test_clc_grouped_workspace_grows_with_the_launched_clusters():
    """CUTLASS keeps a descriptor copy per launched CTA, and CLC launches the tile bound."""
    plan = lambda rows: jax_cluster.plan_ragged(
        rows, 2048, 1024, 8, problem="ragged_m", dtype=jnp.bfloat16, device=B200
    )
    assert plan(8192).workspace_bytes > plan(1024).workspace_bytes


@pytest.mark.parametrize(
    "device,word", [(DeviceInfo("cpu"), "cpu"), (DeviceInfo("cuda", "A100", (8, 0), 108), "compute capability")]
)
def test_plan_falls_back_off_hopper(device, word):
    p = jax_cluster.plan_ragged(256, 256, 256, 4, problem="ragged_m", dtype=jnp.bfloat16, device=device)
    assert p.path == "xla" and word in p.reason and p.problem == "ragged_m" and p.groups == 4


@pytest.mark.skipif(not _ffi.with_kernels(), reason="built without kernels")
@pytest.mark.parametrize(
    "m,n,k,problem,b_major,what",
    [
        (256, 256, 7, "ragged_m", "n", "A's K"),
        (256, 12, 256, "ragged_m", "n", "B's N"),
        (256, 256, 7, "ragged_m", "k", "A's K"),
        (12, 256, 256, "ragged_k", "n", "A's M"),  # d_rhs of a K=12 lhs: A [M,12] rows of 24 bytes
    ],
)
def test_misaligned_plans_fall_back_with_reason(m, n, k, problem, b_major, what):
    p = jax_cluster.plan_ragged(m, n, k, 4, problem=problem, dtype=jnp.bfloat16, b_major=b_major, device=H200)
    assert p.path == "xla" and "16-byte" in p.reason and what in p.reason


@pytest.mark.skipif(not _ffi.with_kernels(), reason="built without kernels")
def test_other_fallback_reasons():
    plan = lambda **kw: jax_cluster.plan_ragged(
        **{**dict(m=256, n=256, k=256, groups=4, problem="ragged_m", dtype=jnp.bfloat16, device=H200), **kw}
    )
    assert "bf16 or f16" in plan(dtype=jnp.float32).reason
    assert "not f16" in plan(out_dtype=jnp.float16).reason
    assert "empty" in plan(groups=0).reason and "empty" in plan(m=0).reason
    assert "no compiled sm90a ragged_k variant" in plan(problem="ragged_k", a_major="k").reason
    assert "asked for XLA" in plan(path="xla").reason


def test_planner_argument_errors():
    with pytest.raises(ValueError, match="problem must be one of"):
        jax_cluster.plan_ragged(8, 8, 8, 2, problem="dense", dtype=jnp.bfloat16)
    with pytest.raises(TypeError, match="unknown override"):
        jax_cluster.plan_ragged(8, 8, 8, 2, problem="ragged_m", dtype=jnp.bfloat16, swizzle=2)


def test_explain_for_ragged_plans():
    p = jax_cluster.plan_ragged(256, 256, 256, 4, problem="ragged_k", dtype=jnp.bfloat16, device=DeviceInfo("cpu"))
    text = p.explain()
    assert "Use XLA's ragged_dot" in text and "ragged_k" in text and "groups=4" in text
    # the kernel branch, on a plan made by hand (no grouped row may be compiled here)
    k = dataclasses.replace(
        p,
        path="kernel",
        variant="hand_made",
        arch="sm90a",
        tile_m=128,
        tile_n=256,
        tile_k=64,
        stages=4,
        mma="1cta",
        schedule="dynamic",
        raster="along_m",
        sm_count=132,
        max_active_clusters=132,
    )
    text = k.explain()
    for i, part in enumerate(("Decision", "Evidence", "Contract", "Timeline", "Validation"), 1):
        assert f"{i}. {part}" in text
    assert "over the tiles of 4 groups" in text and "lax.ragged_dot" in text


def test_explain_for_clc_ragged_plans():
    p = jax_cluster.plan_ragged(256, 256, 256, 4, problem="ragged_m", dtype=jnp.bfloat16, device=DeviceInfo("cpu"))
    # a hand-made sm100 plan: the explanation needs no compiled row
    k = dataclasses.replace(
        p,
        path="kernel",
        variant="hand_made",
        arch="sm100f",
        tile_m=256,
        tile_n=256,
        tile_k=64,
        cluster_m=2,
        cluster_n=1,
        stages=4,
        mma="2cta",
        schedule="clc",
        raster="along_m",
        sm_count=148,
        max_active_clusters=74,
    )
    text = k.explain()
    assert "cta_group::2 UMMA" in text and "Cluster Launch Control" in text
    assert "clc: each cluster takes" in text and "work queue" not in text
