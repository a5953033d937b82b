"""Partitioning on a mesh of 8 CPU devices: shardings, numbers and the
collectives in the compiled HLO.

The host device count is fixed when jax starts, so under a one-device pytest
run the single test `test_runs_with_8_host_devices` reruns this file in a
subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import compiled_text, put, rerun_on_8_host_devices
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_cluster
from jax_cluster.primitives import plans

EIGHT = jax.device_count() >= 8
needs_8 = pytest.mark.skipif(not EIGHT, reason="runs in the 8-device subprocess")


@pytest.mark.skipif(EIGHT, reason="already on 8 devices")
def test_runs_with_8_host_devices():
    rerun_on_8_host_devices(__file__)


def test_one_device_lowers_without_the_partitioner():
    """Unsharded, the custom_partitioning call is inlined: the program is the
    plain GEMM, with no partitioner callback left in it."""
    a, b = jnp.ones((16, 32)), jnp.ones((32, 8))
    text = jax.jit(jax_cluster.matmul).lower(a, b).as_text()
    assert "CustomSPMDPartitioning" not in text and "dot_general" in text
    sizes = jnp.array([8, 8], jnp.int32)
    text = jax.jit(jax_cluster.ragged_dot).lower(a, jnp.ones((2, 32, 8)), sizes).as_text()
    assert "CustomSPMDPartitioning" not in text


@pytest.fixture
def mesh():
    return jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto, AxisType.Auto))


def randn(key, shape, dtype=jnp.float32):
    return jax.random.normal(jax.random.key(key), shape, jnp.float32).astype(dtype)


def assert_sharded(x, mesh, spec):
    assert x.sharding.is_equivalent_to(NamedSharding(mesh, spec), x.ndim), (x.sharding, spec)


# (a spec, b spec, output spec, all-reduce expected): a [64,128] @ b [128,32]
MATMUL_CASES = {
    "m": (P("x", None), P(), P("x", None), False),
    "n": (P(), P(None, "y"), P(None, "y"), False),
    "m_and_n": (P("x", None), P(None, "y"), P("x", "y"), False),
    "k": (P(None, "y"), P("y", None), P(), True),
    "m_and_k": (P("x", "y"), P("y", None), P("x", None), True),
}


@needs_8
@pytest.mark.parametrize("case", MATMUL_CASES)
def test_matmul_runs_local_gemms_per_shard(mesh, case):
    sa, sb, so, reduces = MATMUL_CASES[case]
    a, b = randn(0, (64, 128)), randn(1, (128, 32))
    A, B = put(mesh, a, sa), put(mesh, b, sb)
    f = jax.jit(jax_cluster.matmul)
    out = f(A, B)
    assert_sharded(out, mesh, so)
    np.testing.assert_allclose(out, jnp.matmul(a, b, precision="highest"), rtol=1e-5, atol=1e-4)
    hlo = compiled_text(f, A, B)
    assert "all-gather" not in hlo  # no operand is gathered whole
    assert ("all-reduce" in hlo) == reduces


@needs_8
def test_each_shard_is_planned_for_its_local_shape(mesh, monkeypatch):
    seen = []
    real = plans.plan_gemm

    def record(m, n, k, **kw):
        seen.append((m, n, k, kw["batch"]))
        return real(m, n, k, **kw)

    monkeypatch.setattr(plans, "plan_gemm", record)
    # shapes no other test compiles, so the partitioner runs here (no cached executable)
    A = put(mesh, randn(0, (64, 96)), P("x", "y"))
    B = put(mesh, randn(1, (96, 48)), P("y", None))
    jax.jit(jax_cluster.matmul).lower(A, B).compile()
    assert seen == [(64, 48, 96, 1), (32, 48, 24, 1)]  # the call, then its shard: M/2, N, K/4


@needs_8
def test_k_split_sums_fp32_partials_for_bf16(mesh):
    a, b = randn(2, (32, 1024), jnp.bfloat16), randn(3, (1024, 64), jnp.bfloat16)
    out = jax.jit(jax_cluster.matmul)(put(mesh, a, P(None, ("x", "y"))), put(mesh, b, P(("x", "y"), None)))
    assert out.dtype == jnp.bfloat16
    ref = jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32), precision="highest")
    # one bf16 rounding of the fp32 total, not one per shard
    np.testing.assert_allclose(np.asarray(out, np.float32), ref, rtol=1e-2, atol=1e-2 * 32)


@needs_8
def test_batched_dot_general_keeps_batch_sharding(mesh):
    lhs, rhs = randn(4, (4, 16, 32)), randn(5, (4, 32, 24))
    dims = (((2,), (1,)), ((0,), (0,)))
    L, R = put(mesh, lhs, P("x", "y")), put(mesh, rhs, P("x"))
    f = jax.jit(lambda l, r: jax_cluster.dot_general(l, r, dims))
    out = f(L, R)
    assert_sharded(out, mesh, P("x", "y"))
    np.testing.assert_allclose(out, lax.dot_general(lhs, rhs, dims, precision="highest"), rtol=1e-5, atol=1e-5)
    assert "all-gather" not in compiled_text(f, L, R)


@needs_8
def test_data_parallel_grads_reduce_only_the_weight_gradient(mesh):
    x, w = randn(6, (64, 32)), randn(7, (32, 16))
    X, W = put(mesh, x, P(("x", "y"))), put(mesh, w, P())

    def loss(x, w):
        return (jax_cluster.matmul(x, w) ** 2).sum()

    f = jax.jit(jax.grad(loss, (0, 1)))
    dx, dw = f(X, W)
    rx, rw = jax.grad(lambda x, w: (jnp.matmul(x, w, precision="highest") ** 2).sum(), (0, 1))(x, w)
    np.testing.assert_allclose(dx, rx, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw, rw, rtol=1e-4, atol=1e-3)
    hlo = compiled_text(f, X, W)
    assert "all-gather" not in hlo and "all-reduce" in hlo


@needs_8
def test_tensor_parallel_mlp_reduces_once(mesh):
    """Megatron's MLP: W1 split on N, W2 on K; the only collective is W2's psum."""
    x, w1, w2 = randn(17, (32, 64)), randn(18, (64, 128)), randn(19, (128, 64))
    X, W1, W2 = put(mesh, x, P("x")), put(mesh, w1, P(None, "y")), put(mesh, w2, P("y"))
    f = jax.jit(lambda x, w1, w2: jax_cluster.matmul(jax.nn.relu(jax_cluster.matmul(x, w1)), w2))
    out = f(X, W1, W2)
    assert_sharded(out, mesh, P("x"))
    ref = jnp.matmul(jax.nn.relu(jnp.matmul(x, w1, precision="highest")), w2, precision="highest")
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-3)
    hlo = compiled_text(f, X, W1, W2)
    assert "all-gather" not in hlo and hlo.count("all-reduce(") == 1


@needs_8
def test_vmap_of_sharded_matmul(mesh):
    a, b = randn(8, (8, 16, 32)), randn(9, (32, 24))
    A = put(mesh, a, P(("x", "y")))
    out = jax.jit(jax.vmap(jax_cluster.matmul, in_axes=(0, None)))(A, b)
    assert_sharded(out, mesh, P(("x", "y")))
    np.testing.assert_allclose(out, jnp.matmul(a, b, precision="highest"), rtol=1e-5, atol=1e-5)


@needs_8
def test_dot_general_honours_out_sharding(mesh):
    a, b = randn(10, (64, 32)), randn(11, (32, 16))
    want = NamedSharding(mesh, P(None, "y"))
    f = jax.jit(lambda a, b: jax_cluster.dot_general(a, b, (((1,), (0,)), ((), ())), out_sharding=want))
    out = f(put(mesh, a, P("x")), b)
    assert "jax_cluster_gemm" in str(jax.make_jaxpr(f)(a, b))
    assert_sharded(out, mesh, P(None, "y"))
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- ragged


def block_reference(lhs, rhs, sizes):
    """Row block s multiplied by lax.ragged_dot with its own sizes[s]."""
    rows = lhs.shape[0] // sizes.shape[0]
    return jnp.concatenate(
        [
            lax.ragged_dot(lhs[s * rows : (s + 1) * rows], rhs, sizes[s], precision="highest")
            for s in range(sizes.shape[0])
        ]
    )


def block_sizes(blocks, rows, groups, seed):
    """Per-block sizes summing to at most `rows` (some rows left past the groups)."""
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.integers(0, rows + 1, size=(blocks, groups)), axis=1)
    return jnp.asarray(np.diff(cuts, axis=1, prepend=0), jnp.int32)


@needs_8
@pytest.mark.parametrize("blocks,spec", [(8, P(("x", "y"))), (4, P("x"))])
def test_ragged_dot_token_sharded(mesh, blocks, spec):
    lhs, rhs = randn(12, (blocks * 24, 16)), randn(13, (5, 16, 8))
    sizes = block_sizes(blocks, 24, 5, seed=blocks)
    L, S = put(mesh, lhs, spec), put(mesh, sizes, spec)
    f = jax.jit(jax_cluster.ragged_dot)
    out = f(L, rhs, S)
    assert_sharded(out, mesh, spec)
    np.testing.assert_allclose(out, block_reference(lhs, rhs, sizes), rtol=1e-5, atol=1e-5)
    assert "all-gather" not in compiled_text(f, L, rhs, S)
    # unsharded, [S,G] sizes mean the same blocks
    np.testing.assert_allclose(
        jax_cluster.ragged_dot(lhs, rhs, sizes), block_reference(lhs, rhs, sizes), rtol=1e-5, atol=1e-5
    )


@needs_8
def test_ragged_dot_token_sharded_grads(mesh):
    lhs, rhs = randn(14, (8 * 16, 16)), randn(15, (3, 16, 8))
    sizes = block_sizes(8, 16, 3, seed=0)
    spec = P(("x", "y"))
    L, S = put(mesh, lhs, spec), put(mesh, sizes, spec)

    def loss(dot):
        return lambda x, w, s: (dot(x, w, s) ** 2).sum()

    f = jax.jit(jax.grad(loss(jax_cluster.ragged_dot), (0, 1)))
    dx, dw = f(L, rhs, S)
    rx, rw = jax.grad(loss(block_reference), (0, 1))(lhs, rhs, sizes)
    np.testing.assert_allclose(dx, rx, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw, rw, rtol=1e-4, atol=1e-3)
    hlo = compiled_text(f, L, rhs, S)
    assert "all-gather" not in hlo and "all-reduce" in hlo  # only d_rhs is summed


@needs_8
def test_summed_grouped_partials_stay_on_the_kernels(mesh, monkeypatch):
    """The weight gradient of token-sharded blocks and a K-split forward are
    partial products summed across shards; the grouped kernels write their
    input dtype only, so the partials are planned in it (and added in fp32)
    rather than in fp32 on XLA's path. Plans are made for a described H200,
    on shapes large enough for the kernels (compiled, not run)."""
    from jax_cluster import _ffi
    from jax_cluster.planning.device import DeviceInfo

    if not _ffi.compiled_variant_names():
        pytest.skip("the extension is not built: no plan takes a kernel")
    h200 = DeviceInfo("cuda", "described H200", (9, 0), 132, 232448, 50 << 20)
    real_fresh, real_partials, made = plans.fresh, plans.for_partials, []

    def partials(*args):  # the plans the summed partials run
        plan, dtype = real_partials(*args)
        made.append(plan)
        return plan, dtype

    monkeypatch.setattr(plans, "fresh", lambda call, device: real_fresh(call, h200))
    monkeypatch.setattr(plans, "for_partials", partials)

    def shaped(shape, dtype, spec):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))

    loss = lambda x, w, s: (jax_cluster.ragged_dot(x, w, s).astype(jnp.float32) ** 2).sum()  # noqa: E731
    tokens = P(("x", "y"))
    args = shaped((8 * 2048, 2048), jnp.bfloat16, tokens), shaped((8, 2048, 2048), jnp.bfloat16, P())
    jax.jit(jax.grad(loss, (0, 1))).lower(*args, shaped((8, 8), jnp.int32, tokens)).compile()
    assert made and all(p.uses_kernel and p.call.problem == "ragged_k" for p in made), [p.reason for p in made]
    made.clear()
    split_k = shaped((4096, 2048), jnp.bfloat16, P(None, "y")), shaped((8, 2048, 2048), jnp.bfloat16, P(None, "y"))
    jax.jit(jax_cluster.ragged_dot).lower(*split_k, shaped((8,), jnp.int32, P())).compile()
    assert made and all(p.uses_kernel and p.call.k == 512 for p in made), [p.reason for p in made]


@needs_8
@pytest.mark.parametrize("layout", ["gkn", "gnk"])
def test_ragged_expert_mlp_data_and_tensor_parallel(mesh, layout):
    """Tokens split on x, each expert's hidden dim on y: w_in split on N, w_out
    on K; the forward's one collective is w_out's psum."""
    x = randn(20, (4 * 16, 32))
    w_in, w_out = randn(21, (3, 32, 64)), randn(22, (3, 64, 32))
    sizes = block_sizes(4, 16, 3, seed=1)
    as_layout = (lambda w: w) if layout == "gkn" else (lambda w: jnp.swapaxes(w, 1, 2))
    hidden_split = P(None, None, "y") if layout == "gkn" else P(None, "y", None)
    out_split = P(None, "y", None) if layout == "gkn" else P(None, None, "y")
    args = (
        put(mesh, x, P("x")),
        put(mesh, as_layout(w_in), hidden_split),
        put(mesh, as_layout(w_out), out_split),
        put(mesh, sizes, P("x")),
    )

    def mlp(x, w_in, w_out, sizes):
        h = jax.nn.relu(jax_cluster.ragged_dot(x, w_in, sizes, rhs_layout=layout))
        return jax_cluster.ragged_dot(h, w_out, sizes, rhs_layout=layout)

    def reference(x, w_in, w_out, sizes):
        return block_reference(jax.nn.relu(block_reference(x, w_in, sizes)), w_out, sizes)

    f = jax.jit(mlp)
    out = f(*args)
    assert_sharded(out, mesh, P("x"))
    np.testing.assert_allclose(out, reference(x, w_in, w_out, sizes), rtol=1e-4, atol=1e-3)
    hlo = compiled_text(f, *args)
    assert "all-gather" not in hlo and hlo.count("all-reduce(") == 1
    loss = lambda fn: lambda *a: (fn(*a) ** 2).sum()  # noqa: E731
    grads = jax.jit(jax.grad(loss(mlp), (0, 1, 2)))(*args)
    want = jax.grad(loss(reference), (0, 1, 2))(x, w_in, w_out, sizes)
    for g, w in zip(grads, (want[0], as_layout(want[1]), as_layout(want[2]))):
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-2)
    assert "all-gather" not in compiled_text(jax.jit(jax.grad(loss(mlp), (0, 1, 2))), *args)


# --------------------------------------------------------------------------- fused epilogue

# (x spec, w spec, bias spec, residual spec, output spec, all-reduce expected):
# gelu(x [64,128] @ w [128,32] + bias [32] + residual [64,32])
LINEAR_CASES = {
    "m": (P("x", None), P(), P(), P("x", None), P("x", None), False),
    "n": (P(), P(None, "y"), P("y"), P(None, "y"), P(None, "y"), False),
    "m_and_n": (P("x", None), P(None, "y"), P("y"), P("x", "y"), P("x", "y"), False),
    "k": (P(None, "y"), P("y", None), P(), P(), P(), True),
}


@needs_8
@pytest.mark.parametrize("case", LINEAR_CASES)
def test_linear_runs_fused_kernels_per_shard(mesh, case):
    sx, sw, sb, sr, so, reduces = LINEAR_CASES[case]
    x, w, b, r = randn(20, (64, 128)), randn(21, (128, 32)), randn(22, (32,)), randn(23, (64, 32))
    args = [put(mesh, v, s) for v, s in ((x, sx), (w, sw), (b, sb), (r, sr))]
    f = jax.jit(lambda x, w, b, r: jax_cluster.linear(x, w, b, residual=r, activation="gelu"))
    out = f(*args)
    assert_sharded(out, mesh, so)
    ref = jax.nn.gelu(jnp.matmul(x, w, precision="highest") + b + r)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)
    hlo = compiled_text(f, *args)
    assert "all-gather" not in hlo
    assert ("all-reduce" in hlo) == reduces


@needs_8
def test_linear_data_parallel_grads_reduce_only_weights(mesh):
    x, w, b = randn(24, (64, 16)), randn(25, (16, 32)), randn(26, (32,))
    X = put(mesh, x, P(("x", "y")))
    loss = lambda x, w, b: jnp.sum(jax_cluster.linear(x, w, b, activation="silu") ** 2)  # noqa: E731
    f = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    dx, dw, db = f(X, w, b)
    assert_sharded(dx, mesh, P(("x", "y")))
    want = jax.grad(
        lambda x, w, b: jnp.sum(jax.nn.silu(jnp.matmul(x, w, precision="highest") + b) ** 2), argnums=(0, 1, 2)
    )(x, w, b)
    for got, ref in zip((dx, dw, db), want):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    assert "all-gather" not in compiled_text(f, X, w, b)


# --------------------------------------------------------------------------- layers


@needs_8
def test_layers_data_parallel(mesh):
    nnx = pytest.importorskip("flax.nnx")
    from jax_cluster import nn as jcnn

    x = randn(16, (8, 6, 16))
    X = put(mesh, x, P(("x", "y")))
    linear = jcnn.Linear(16, 32, rngs=nnx.Rngs(0))
    moe = jcnn.MoEMLP(16, 32, 4, 2, token_blocks=8, rngs=nnx.Rngs(1))
    ref = jcnn.MoEMLP(16, 32, 4, 2, rngs=nnx.Rngs(1))

    graph, state = nnx.split((linear, moe))

    @jax.jit
    def apply(state, x):
        linear, moe = nnx.merge(graph, state)
        return linear(x), moe(x)

    y, z = apply(state, X)
    assert_sharded(y, mesh, P(("x", "y")))
    assert_sharded(z, mesh, P(("x", "y")))
    # tokens, routing and experts all stay on their shard
    assert "all-gather" not in compiled_text(apply, state, X)
    np.testing.assert_allclose(y, nnx.Linear(16, 32, rngs=nnx.Rngs(0))(x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(z, ref(x), rtol=1e-5, atol=1e-5)


@needs_8
@pytest.mark.parametrize("rhs_layout", ["gkn", "gnk"])
def test_group_offset_under_shard_map_is_expert_parallel(rhs_layout):
    """16 experts over 8 devices, two each: every device multiplies the rows of
    its own experts (group_offset = 2 * its index) and the psum over devices is
    the whole ragged_dot; the gradients match the dense reference too."""
    mesh = jax.make_mesh((8,), ("e",), axis_types=(AxisType.Auto,))
    rng = np.random.default_rng(21)
    m, k, n, experts = 256, 32, 48, 16
    lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
    rhs = jnp.asarray(rng.standard_normal((experts, k, n) if rhs_layout == "gkn" else (experts, n, k)), jnp.float32)
    sizes = jnp.asarray(rng.multinomial(m - 20, rng.dirichlet(np.full(experts, 0.5))), jnp.int32)
    local = experts // 8

    def expert_parallel(x, w, s):
        offset = lax.axis_index("e") * local
        part = jax_cluster.ragged_dot(x, w, s, group_offset=offset, rhs_layout=rhs_layout)
        return lax.psum(part, "e")

    sharded = jax.shard_map(expert_parallel, mesh=mesh, in_specs=(P(), P("e"), P()), out_specs=P(), check_vma=False)

    def loss(f):
        return lambda x, w: (f(x, w) ** 2).sum()

    whole = lambda x, w: jax_cluster.ragged_dot(x, w, sizes, rhs_layout=rhs_layout)  # noqa: E731
    ours = lambda x, w: sharded(x, w, sizes)  # noqa: E731
    np.testing.assert_allclose(jax.jit(ours)(lhs, rhs), whole(lhs, rhs), rtol=1e-5, atol=1e-4)
    for got, want in zip(jax.jit(jax.grad(loss(ours), (0, 1)))(lhs, rhs), jax.grad(loss(whole), (0, 1))(lhs, rhs)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


@needs_8
def test_gated_product_keeps_row_blocks_whole():
    """[S, G] sizes with the rows and the blocks sharded: each device gates its own blocks."""
    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
    x = randn(20, (8 * 16, 32)).astype(jnp.bfloat16)
    w = randn(21, (3, 32, 32)).astype(jnp.bfloat16)  # gate and up blocks of 8 interleaved
    sizes = jnp.asarray(np.random.default_rng(0).integers(0, 7, (8, 3)), jnp.int32)
    plan = jax_cluster.plan_ragged(16, 32, 32, 3, problem="ragged_m", dtype=jnp.bfloat16, epilogue="gated")
    gated = jax.jit(lambda x, w, s: jax_cluster.gated_ragged_dot(x, w, s, plan=plan))  # the gated primitive
    out = gated(put(mesh, x, P("x")), w, put(mesh, sizes, P("x")))
    assert_sharded(out, mesh, P("x"))
    whole = jax_cluster.gated_ragged_dot(x, w, sizes)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(whole, np.float32), rtol=1e-2, atol=1e-2)


def test_rule_terms_leave_out_size_one_factors():
    """Shardy refuses a size-1 factor inside a compound and sizes of whole
    dimensions, and wants special factors in the rule's own order."""
    from jax_cluster.primitives.specs import rule_options, term, tied

    assert term(("s", 4), ("r", 32)) == ("(s r)", {"s": 4, "r": 32})
    assert term(("s", 1), ("r", 32)) == ("r", {}) and term(("s", 1), ("r", 1)) == ("s", {})
    assert tied("k", 128, 128)[:2] == ("kt", "kb") and tied("k", 384, 128)[0] == "(kb kt)"
    assert tied("n", 200, 128) == ("n", "nb", {}, ("nb",))
    rule = "m (kb kt), n (kb kt), kb m, kb nb -> m n"
    options = rule_options(rule, reduction=("kt", "kb", "k"), replication=("nb", "r"), sizes={"kb": 3, "kt": 128})
    assert options == {"kt": 128, "reduction_factors": ("kb", "kt"), "need_replication_factors": ("nb",)}
