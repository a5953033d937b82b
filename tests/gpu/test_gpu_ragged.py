"""The grouped kernels behind ragged_dot on a real GPU, against float32 references.

Outputs are poisoned with NaN before every launch (conftest), so a tile the
kernel skips fails the finiteness check; inputs are fresh random draws; every
case asserts that the planner chose the kernel, so a silent fallback fails.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import group_bounds, randn, rel_error, tolerance
from jax import lax

import jax_cluster
from jax_cluster import _ffi
from jax_cluster.planning import tables
from jax_cluster.planning.tables import FFI_TARGETS
from jax_cluster.primitives.ragged import ragged

pytestmark = pytest.mark.gpu
HIGHEST = lax.Precision.HIGHEST


def _skewed(rows, groups, empty_every=0, seed=None):
    """Sizes of `groups` groups summing to `rows`, uneven like MoE routing."""
    rng = np.random.default_rng(seed)
    weights = rng.pareto(1.5, groups) + 0.01
    if empty_every:
        weights[::empty_every] = 0
    sizes = np.floor(weights / weights.sum() * rows).astype(np.int32)
    sizes[np.argmax(weights)] += rows - sizes.sum()
    return sizes.tolist()


# (name, M, K, N, sizes); K and N are multiples of 8 (TMA) but not of the tile
CASES = [
    ("uniform", 1024, 512, 384, [128] * 8),
    ("empty groups", 768, 256, 256, [0, 300, 0, 0, 468, 0]),
    ("one-row groups", 256, 256, 256, [1] * 64 + [192]),
    ("all in one group", 512, 256, 256, [0, 0, 512, 0]),
    ("G=256", 4096, 256, 512, _skewed(4096, 256, empty_every=5)),
    ("sum < M", 1000, 256, 256, [300, 0, 400]),
    ("sum > M", 512, 256, 256, [300, 300, 100]),
    ("negative sizes", 512, 256, 256, [-5, 200, -1, 300]),
    ("sizes near int32 max", 256, 128, 128, [2**31 - 1, 5, 2**31 - 1]),
    ("K and N off the tile", 333, 200, 136, [100, 0, 233]),
    ("one row", 1, 64, 64, [1]),
    # the MoE shapes, scaled down: Mixtral-like (8 experts, top-2 routing)
    # and DeepSeek-like (256 routed experts, narrow experts)
    ("moe 8 experts", 4096, 1024, 3584, _skewed(4096, 8)),
    ("moe 256 experts", 4096, 1792, 512, _skewed(4096, 256)),
]
IDS = [c[0] for c in CASES]


def _kernel_plan(m, n, k, groups, *, problem="ragged_m", b_major="n", dtype=jnp.bfloat16):
    p = jax_cluster.plan_ragged(m, n, k, groups, problem=problem, dtype=dtype, b_major=b_major)
    assert p.path == "kernel", f"{problem} {m}x{n}x{k} G={groups} fell back: {p.reason}"
    return p


def _row_masks(sizes, rows):
    """[G, rows] float32: 1 where the row belongs to the group (the clamping rule)."""
    mask = np.zeros((len(sizes), rows), np.float32)
    for g, (lo, hi) in enumerate(group_bounds(sizes, rows)):
        mask[g, lo:hi] = 1
    return mask


@jax.jit
def _masked_ragged_m(lhs, rhs, mask):
    # one dense dot per group, kept where the mask is set: one compile per shape
    def add(g, out):
        return out + mask[g][:, None] * jnp.dot(lhs, rhs[g], precision=HIGHEST)

    return lax.fori_loop(0, rhs.shape[0], add, jnp.zeros((lhs.shape[0], rhs.shape[2]), jnp.float32))


def _reference(lhs, rhs, sizes, layout):
    """float32 on the device, every group over its clamped rows."""
    rhs = rhs.astype(jnp.float32)
    if layout == "gnk":
        rhs = jnp.swapaxes(rhs, 1, 2)
    return _masked_ragged_m(lhs.astype(jnp.float32), rhs, _row_masks(sizes, lhs.shape[0]))


def _ragged_k_reference(a, b, sizes):
    mask = _row_masks(sizes, a.shape[0])
    return jnp.einsum("gm,mk,mn->gkn", mask, a.astype(jnp.float32), b.astype(jnp.float32), precision=HIGHEST)


def _bits(x):
    x = np.asarray(x)
    return x.view(np.uint16 if x.dtype.itemsize == 2 else np.uint32)


def _operands(m, k, n, groups, layout, dtype=jnp.bfloat16):
    return randn((m, k), dtype), randn((groups, k, n) if layout == "gkn" else (groups, n, k), dtype)


@pytest.mark.parametrize("layout", ["gkn", "gnk"])
@pytest.mark.parametrize("name,m,k,n,sizes", CASES, ids=IDS)
def test_forward_on_the_kernel(name, m, k, n, sizes, layout):
    plan = _kernel_plan(m, n, k, len(sizes), b_major="n" if layout == "gkn" else "k")
    lhs, rhs = _operands(m, k, n, len(sizes), layout)
    gs = jnp.asarray(sizes, jnp.int32)
    f = jax.jit(lambda l, r, g: jax_cluster.ragged_dot(l, r, g, rhs_layout=layout, plan=plan))
    out = f(lhs, rhs, gs)
    assert rel_error(out, _reference(lhs, rhs, sizes, layout)) < tolerance(jnp.bfloat16)
    covered = group_bounds(sizes, m)[-1][1]
    assert np.all(np.asarray(out[covered:], np.float32) == 0), "rows past the groups must be 0"
    assert np.array_equal(_bits(out), _bits(f(lhs, rhs, gs))), "not deterministic"


DECODE_ROWS = [v.name for v in tables.load_menu() if v.kind == "decode" and v.dtype == "bf16"]
# (name, M, K, N, sizes): decode's few rows per group, and everything its work
# items must get right: groups longer than one item's rows, N off the 256-wide
# tile, K that the cluster's CTAs split unevenly or too short to give every CTA a
# step of rows, the size rules, many groups
DECODE_CASES = [
    ("one row per group", 8, 2048, 768, [1] * 8 + [0] * 120),
    ("two rows per group", 64, 1024, 512, [2] * 32),
    ("groups longer than an item", 300, 512, 264, [0, 1, 150, 0, 9, 140]),
    ("sum < M, empty groups", 100, 256, 256, [0, 30, 0, 20]),
    ("sum > M", 64, 256, 512, [40, 40, 40]),
    ("negative sizes", 64, 256, 256, [-5, 20, -1, 30]),
    ("sizes near int32 max", 16, 128, 128, [2**31 - 1, 5, 2**31 - 1]),
    ("K split unevenly", 40, 136, 264, [10, 0, 30]),
    ("K too short for every CTA", 5, 24, 256, [3, 2]),
    ("one row", 1, 64, 64, [1]),
    ("every group empty", 16, 128, 128, [0, 0, 0]),
    ("1024 groups", 512, 256, 256, _skewed(512, 1024, empty_every=3, seed=7)),
]


@pytest.mark.parametrize("variant", DECODE_ROWS)
@pytest.mark.parametrize("name,m,k,n,sizes", DECODE_CASES, ids=[c[0] for c in DECODE_CASES])
def test_decode_rows(name, m, k, n, sizes, variant):
    if variant not in _ffi.compiled_variant_names():
        pytest.skip(f"{variant} is not in this build")
    plan = jax_cluster.plan_ragged(m, n, k, len(sizes), problem="ragged_m", dtype=jnp.bfloat16, variant=variant)
    assert plan.variant == variant, plan.reason
    lhs, rhs = _operands(m, k, n, len(sizes), "gkn")
    gs = jnp.asarray(sizes, jnp.int32)
    f = jax.jit(lambda l, r, g: jax_cluster.ragged_dot(l, r, g, plan=plan))
    out = f(lhs, rhs, gs)
    ref = _reference(lhs, rhs, sizes, "gkn")
    assert rel_error(out, ref) < tolerance(jnp.bfloat16)
    # elementwise too: each element within a few bf16 roundings of its row's scale
    scale = np.abs(np.asarray(ref)).max(axis=1, keepdims=True) + 1e-30
    assert np.all(np.abs(np.asarray(out, np.float32) - np.asarray(ref)) <= 4 * 2**-8 * scale)
    covered = group_bounds(sizes, m)[-1][1]
    assert np.all(np.asarray(out[covered:], np.float32) == 0), "rows past the groups must be 0"
    assert np.array_equal(_bits(out), _bits(f(lhs, rhs, gs))), "not deterministic"


def test_decode_rows_refuse_more_groups_than_their_table():
    if not DECODE_ROWS or DECODE_ROWS[0] not in _ffi.compiled_variant_names():
        pytest.skip("no decode row in this build")
    groups = tables.DECODE_MAX_GROUPS + 1
    plan = jax_cluster.plan_ragged(64, 256, 256, groups, problem="ragged_m", dtype=jnp.bfloat16, variant=DECODE_ROWS[0])
    assert plan.path == "xla" and str(tables.DECODE_MAX_GROUPS) in plan.reason


@pytest.mark.parametrize("layout", ["gkn", "gnk"])
@pytest.mark.parametrize(
    "name,m,k,n,sizes", [CASES[0], CASES[1], CASES[5], CASES[9]], ids=[IDS[0], IDS[1], IDS[5], IDS[9]]
)
def test_f16_on_the_kernel(name, m, k, n, sizes, layout):
    plan = _kernel_plan(m, n, k, len(sizes), b_major="n" if layout == "gkn" else "k", dtype=jnp.float16)
    lhs, rhs = _operands(m, k, n, len(sizes), layout, jnp.float16)
    out = jax.jit(lambda l, r, g: jax_cluster.ragged_dot(l, r, g, rhs_layout=layout, plan=plan))(
        lhs, rhs, jnp.asarray(sizes, jnp.int32)
    )
    assert out.dtype == jnp.float16
    assert rel_error(out, _reference(lhs, rhs, sizes, layout)) < tolerance(jnp.float16)


def test_f32_output_is_right_on_either_path():
    """No grouped row writes f32 yet; whichever path the plan takes must be right."""
    lhs, rhs = _operands(512, 256, 256, 4, "gkn")
    sizes = [100, 0, 300, 50]
    f = lambda l, r, g: jax_cluster.ragged_dot(l, r, g, preferred_element_type=jnp.float32)
    out = jax.jit(f)(lhs, rhs, jnp.asarray(sizes, jnp.int32))
    assert out.dtype == jnp.float32
    assert rel_error(out, _reference(lhs, rhs, sizes, "gkn")) < 1e-4


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("sizes", [[200, 0, 1, 500, 0, 200], [-3, 700, 0, 400, 9, 0]], ids=str)
@pytest.mark.parametrize("m,k,n", [(1024, 512, 384), (512, 136, 200)])
def test_ragged_k_on_the_kernel(m, k, n, sizes, dtype):
    """The d_rhs product alone: out[g] = a[rows g]^T b[rows g]; groups without rows are 0."""
    plan = _kernel_plan(k, n, m, len(sizes), problem="ragged_k", dtype=dtype)
    a, b = randn((m, k), dtype), randn((m, n), dtype)
    f = jax.jit(lambda a, b, g: ragged(a, b, g, problem="ragged_k", plan=plan))
    out = f(a, b, jnp.asarray(sizes, jnp.int32))
    assert out.shape == (len(sizes), k, n) and out.dtype == dtype
    assert rel_error(out, _ragged_k_reference(a, b, sizes)) < tolerance(dtype)
    for g, (lo, hi) in enumerate(group_bounds(sizes, m)):
        if lo == hi:
            assert np.all(np.asarray(out[g], np.float32) == 0), f"group {g} has no rows"
    assert np.array_equal(_bits(out), _bits(f(a, b, jnp.asarray(sizes, jnp.int32))))


@pytest.mark.parametrize("layout", ["gkn", "gnk"])
@pytest.mark.parametrize(
    "name,m,k,n,sizes",
    [
        ("mixed", 1024, 512, 384, [200, 0, 1, 500, 0, 200]),
        ("moe 8 experts", 2048, 1024, 896, _skewed(2048, 8)),
    ],
    ids=["mixed", "moe 8 experts"],
)
def test_gradients_match_lax_ragged_dot(name, m, k, n, sizes, layout):
    b_major = "n" if layout == "gkn" else "k"
    g = len(sizes)
    plan = _kernel_plan(m, n, k, g, b_major=b_major)
    _kernel_plan(m, k, n, g, b_major="k" if b_major == "n" else "n")  # d_lhs
    _kernel_plan(*((k, n) if layout == "gkn" else (n, k)), m, g, problem="ragged_k")  # d_rhs
    lhs, rhs = _operands(m, k, n, g, layout)
    gs = jnp.asarray(sizes, jnp.int32)
    ct = randn((m, n), jnp.float32)

    def ours(l, r):
        return (jax_cluster.ragged_dot(l, r, gs, rhs_layout=layout, plan=plan).astype(jnp.float32) * ct).sum()

    def theirs(l, r):
        w = r if layout == "gkn" else jnp.swapaxes(r, 1, 2)
        return (lax.ragged_dot(l, w, gs, precision=HIGHEST) * ct).sum()

    grad = jax.jit(jax.grad(ours, argnums=(0, 1)))
    got = grad(lhs, rhs)
    want = jax.grad(theirs, argnums=(0, 1))(lhs.astype(jnp.float32), rhs.astype(jnp.float32))
    for x, ref in zip(got, want):
        assert x.dtype == jnp.bfloat16 and rel_error(x, ref) < 2 * tolerance(jnp.bfloat16)
    again = grad(lhs, rhs)
    for x, y in zip(got, again):
        assert np.array_equal(_bits(x), _bits(y)), "gradients not deterministic"
    hlo = grad.lower(lhs, rhs).as_text()
    assert hlo.count(FFI_TARGETS["ragged_dot"]) >= 2


def test_row_block_gradients_run_every_product_on_the_kernels():
    """[S, G] sizes (MoEMLP's token_blocks): each block's forward, input
    gradient and weight gradient is a kernel call; the weight gradient's
    per-block partials are the kernel's bf16, added in float32."""
    blocks, rows, k, n, g = 2, 2048, 1024, 896, 8
    _kernel_plan(rows, n, k, g)
    _kernel_plan(k, n, rows, g, problem="ragged_k")
    lhs, rhs = _operands(blocks * rows, k, n, g, "gkn")
    gs = jnp.asarray([_skewed(rows, g, seed=s) for s in range(blocks)], jnp.int32)
    ct = randn((blocks * rows, n), jnp.float32)
    loss = lambda l, r: (jax_cluster.ragged_dot(l, r, gs).astype(jnp.float32) * ct).sum()  # noqa: E731
    # the value too: the loss is linear, so a gradient alone never runs the forward product
    step = jax.jit(jax.value_and_grad(loss, (0, 1)))
    assert step.lower(lhs, rhs).as_text().count(FFI_TARGETS["ragged_dot"]) >= 3 * blocks
    value, (d_lhs, d_rhs) = step(lhs, rhs)

    def block_out(l, r):
        out = [lax.ragged_dot(l[b * rows : (b + 1) * rows], r, gs[b], precision=HIGHEST) for b in range(blocks)]
        return jnp.concatenate(out)

    wide = (lhs.astype(jnp.float32), rhs.astype(jnp.float32))
    want_value, want = jax.value_and_grad(lambda l, r: (block_out(l, r) * ct).sum(), (0, 1))(*wide)
    # each output element rounded to bf16 once: the sum's error is bounded by eps times sum |out * ct|
    bound = 2 * tolerance(jnp.bfloat16) * float(jnp.abs(block_out(*wide) * ct).sum())
    assert abs(float(value) - float(want_value)) <= bound
    assert rel_error(d_lhs, want[0]) < 2 * tolerance(jnp.bfloat16)
    assert rel_error(d_rhs, want[1]) < 2 * tolerance(jnp.bfloat16)


@pytest.mark.parametrize("layout", ["gkn", "gnk"])
def test_d_rhs_of_empty_groups_is_exactly_zero(layout):
    m, k, n = 512, 256, 384
    # groups 0, 2, 3 and 5 are empty; group 6 starts at M, so it is cut to nothing
    sizes = [0, 300, 0, -3, 212, 0, 100]
    lhs, rhs = _operands(m, k, n, len(sizes), layout)
    plan = _kernel_plan(m, n, k, len(sizes), b_major="n" if layout == "gkn" else "k")
    gs = jnp.asarray(sizes, jnp.int32)
    d_rhs = jax.jit(
        jax.grad(lambda r: jax_cluster.ragged_dot(lhs, r, gs, rhs_layout=layout, plan=plan).astype(jnp.float32).sum())
    )(rhs)
    d = np.asarray(d_rhs, np.float32)
    for g in (0, 2, 3, 5, 6):
        assert np.all(d[g] == 0), f"group {g} has no rows: its gradient must be exactly 0"
    # the others: lhs_g^T . ones, as stored ([G,N,K] for gnk)
    ref = _ragged_k_reference(lhs, jnp.ones((m, n), jnp.bfloat16), sizes)
    assert rel_error(d_rhs, ref if layout == "gkn" else jnp.swapaxes(ref, 1, 2)) < tolerance(jnp.bfloat16)


def test_jit_with_changing_sizes_neither_retraces_nor_syncs():
    m, k, n, g = 1024, 256, 256, 4
    plan = _kernel_plan(m, n, k, g)
    traces = []

    @jax.jit
    def f(lhs, rhs, gs):
        traces.append(1)
        return jax_cluster.ragged_dot(lhs, rhs, gs, plan=plan)

    lhs, rhs = _operands(m, k, n, g, "gkn")
    runs = [[256, 256, 256, 256], [0, 1024, 0, 0], [1, 2, 3, 1018], [-1, 500, 0, 9000], [100, 100, 0, 0]]
    sizes = [jax.device_put(np.asarray(s, np.int32)) for s in runs]
    f(lhs, rhs, sizes[0]).block_until_ready()  # compile outside the guard
    with jax.transfer_guard("disallow"):  # the group sizes never go to the host
        outs = [f(lhs, rhs, s) for s in sizes]
        jax.block_until_ready(outs)
    assert len(traces) == 1
    for s, out in zip(runs, outs):
        assert rel_error(out, _reference(lhs, rhs, s, "gkn")) < tolerance(jnp.bfloat16)
    assert FFI_TARGETS["ragged_dot"] in f.lower(lhs, rhs, sizes[0]).as_text()


def test_repeated_calls_inside_one_jit_are_stable():
    """Several grouped calls and elementwise work in one executable (XLA may
    capture it as a command buffer), run many times."""
    m, k, n, g = 1024, 512, 512, 8
    lhs, rhs = _operands(m, k, n, g, "gkn")
    w2 = randn((g, n, k), jnp.bfloat16)
    gs = jnp.asarray(_skewed(m, g, empty_every=3), jnp.int32)
    _kernel_plan(m, n, k, g)
    _kernel_plan(m, k, n, g, b_major="k")

    @jax.jit
    def f(lhs, rhs, w2, gs):
        x = jnp.tanh(jax_cluster.ragged_dot(lhs, rhs, gs))
        return jax_cluster.ragged_dot(x, w2, gs, rhs_layout="gnk")

    first = np.asarray(f(lhs, rhs, w2, gs))
    assert np.isfinite(first.astype(np.float32)).all()
    for _ in range(20):
        assert np.array_equal(_bits(f(lhs, rhs, w2, gs)), _bits(first))


def test_plan_on_the_gpu_is_queried():
    p = _kernel_plan(4096, 2048, 1024, 8)
    assert p.residency == "queried" and p.device.source == "queried"
    assert 0 < p.max_active_clusters <= p.sm_count
    assert "8 groups" in p.explain()


GATED_CASES = [c for c in CASES if c[3] % 16 == 0 and c[1] > 1]  # N: whole gate/up block pairs


@pytest.mark.parametrize("activation", ["silu", "gelu"])
@pytest.mark.parametrize("case", GATED_CASES, ids=[c[0] for c in GATED_CASES])
def test_gated_epilogue_matches_float32(case, activation):
    """The gated row's epilogue, act(gate) * up of the interleaved columns,
    against the activation and product of the separate float32 products."""
    _, m, k, n, sizes = case
    p = jax_cluster.plan_ragged(m, n, k, len(sizes), problem="ragged_m", dtype=jnp.bfloat16, epilogue="gated")
    assert p.path == "kernel", f"gated {m}x{n}x{k} fell back: {p.reason}"
    x = randn((m, k), jnp.bfloat16)
    gate, up = randn((len(sizes), k, n // 2), jnp.bfloat16), randn((len(sizes), k, n // 2), jnp.bfloat16)
    out = jax.jit(lambda *a: jax_cluster.gated_ragged_dot(*a, activation=activation, plan=p))(
        x, jax_cluster.interleave_gate_up(gate, up), jnp.asarray(sizes, jnp.int32)
    )
    act = {"silu": jax.nn.silu, "gelu": jax.nn.gelu}[activation]
    ref = np.zeros((m, n // 2), np.float32)
    for g, (lo, hi) in enumerate(group_bounds(sizes, m)):
        xs = x[lo:hi].astype(jnp.float32)
        hg = jnp.dot(xs, gate[g].astype(jnp.float32), precision=HIGHEST)
        ref[lo:hi] = act(hg) * jnp.dot(xs, up[g].astype(jnp.float32), precision=HIGHEST)
    assert rel_error(out, ref) < tolerance(jnp.bfloat16)
    covered = max(hi for _, hi in group_bounds(sizes, m))
    assert (np.asarray(out[covered:]) == 0).all()  # rows past the groups: exact zeros
