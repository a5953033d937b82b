"""The Flax layers against Flax's own, on the same parameters (CPU: the fallback)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

flax = pytest.importorskip("flax")
from flax import linen, nnx  # noqa: E402

import jax_cluster  # noqa: E402
from jax_cluster import nn as jcnn  # noqa: E402
from jax_cluster.primitives.epilogue import gemm_epilogue_p  # noqa: E402
from jax_cluster.primitives.gemm import gemm_p  # noqa: E402
from jax_cluster.primitives.ragged import ragged_dot_p  # noqa: E402


def uses(fn, primitive, *args):
    """Whether the jaxpr binds exactly this primitive (not one whose name extends it)."""
    return re.search(rf"\b{primitive.name}\[", str(jax.make_jaxpr(fn)(*args))) is not None


def assert_trees_close(x, y, tol):
    for a, b in zip(jax.tree.leaves(x), jax.tree.leaves(y), strict=True):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=tol, atol=tol)


@pytest.mark.parametrize("use_bias", [True, False])
def test_linear_matches_nnx_linear_and_its_grads(use_bias):
    ours = jcnn.Linear(24, 40, use_bias=use_bias, rngs=nnx.Rngs(0))
    flaxs = nnx.Linear(24, 40, use_bias=use_bias, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (3, 5, 24))
    # same constructor, same keys: the same parameters, under the same names
    assert_trees_close(nnx.state(ours), nnx.state(flaxs), 0)
    assert uses(lambda x: ours(x), gemm_epilogue_p, x)  # product and bias in one kernel
    np.testing.assert_allclose(ours(x), flaxs(x), rtol=1e-5, atol=1e-5)

    def loss(model, x):
        return (model(x) ** 2).sum()

    g_ours = nnx.grad(loss, argnums=(0, 1))(ours, x)
    g_flax = nnx.grad(loss, argnums=(0, 1))(flaxs, x)
    assert_trees_close(g_ours, g_flax, 1e-4)


def test_linear_state_interchanges_both_ways():
    ours = jcnn.Linear(16, 8, rngs=nnx.Rngs(3))
    flaxs = nnx.Linear(16, 8, rngs=nnx.Rngs(4))
    x = jnp.ones((2, 16))
    nnx.update(flaxs, nnx.state(ours))
    np.testing.assert_allclose(flaxs(x), ours(x), rtol=1e-6)
    other = nnx.Linear(16, 8, rngs=nnx.Rngs(5))
    nnx.update(ours, nnx.state(other))
    np.testing.assert_allclose(ours(x), other(x), rtol=1e-6)


@pytest.mark.parametrize(
    "dtype,param_dtype", [(jnp.bfloat16, jnp.float32), (None, jnp.bfloat16), (jnp.float16, jnp.float16)]
)
def test_linear_dtypes_follow_nnx(dtype, param_dtype):
    kw = dict(dtype=dtype, param_dtype=param_dtype)
    ours = jcnn.Linear(32, 16, rngs=nnx.Rngs(0), **kw)
    flaxs = nnx.Linear(32, 16, rngs=nnx.Rngs(0), **kw)
    x = jax.random.normal(jax.random.key(2), (4, 32), jnp.float32).astype(jnp.bfloat16)
    assert ours.kernel[...].dtype == flaxs.kernel[...].dtype == np.dtype(param_dtype)
    y, ref = ours(x), flaxs(x)
    assert y.dtype == ref.dtype
    np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(ref, np.float32), rtol=2e-2, atol=2e-2)


def test_nnx_linear_takes_cluster_dot_general_with_out_sharding():
    ours = nnx.Linear(8, 4, dot_general=jax_cluster.dot_general, rngs=nnx.Rngs(0))
    flaxs = nnx.Linear(8, 4, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (6, 8))
    # nnx passes out_sharding=None: the call must still reach the kernel
    assert uses(lambda x: ours(x), gemm_p, x)
    np.testing.assert_allclose(ours(x), flaxs(x), rtol=1e-6)
    sharding = jax.sharding.NamedSharding(jax.make_mesh((1,), ("d",)), jax.sharding.PartitionSpec("d"))
    y = jax.jit(lambda x: ours(x, out_sharding=sharding))(x)
    assert uses(lambda x: ours(x, out_sharding=sharding), gemm_p, x)
    np.testing.assert_allclose(y, flaxs(x), rtol=1e-6)
    assert y.sharding.is_equivalent_to(sharding, 2)


def test_dot_general_rejects_named_axes_without_a_mesh():
    with pytest.raises(ValueError, match="no mesh is set"):
        jax_cluster.dot_general(
            jnp.ones((2, 3)),
            jnp.ones((3, 4)),
            (((1,), (0,)), ((), ())),
            out_sharding=jax.sharding.PartitionSpec("data"),
        )


@pytest.mark.parametrize("layer", ["ours", "hook"])
def test_linen_dense_matches_flax(layer):
    dense = jcnn.Dense(12) if layer == "ours" else linen.Dense(12, dot_general=jax_cluster.dot_general)
    x = jax.random.normal(jax.random.key(0), (2, 3, 20))
    params = linen.Dense(12).init(jax.random.key(1), x)
    assert jax.tree.structure(dense.init(jax.random.key(1), x)) == jax.tree.structure(params)
    fused = gemm_epilogue_p if layer == "ours" else gemm_p
    assert uses(lambda x: dense.apply(params, x), fused, x)
    np.testing.assert_allclose(dense.apply(params, x), linen.Dense(12).apply(params, x), rtol=1e-5, atol=1e-5)
    g = jax.grad(lambda p: dense.apply(p, x).sum())(params)
    g_ref = jax.grad(lambda p: linen.Dense(12).apply(p, x).sum())(params)
    assert_trees_close(g, g_ref, 1e-4)


def test_grouped_linear_matches_lax_ragged_dot_and_inits_like_linears():
    layer = jcnn.GroupedLinear(4, 16, 24, rngs=nnx.Rngs(0))
    ref = jcnn.GroupedLinear(4, 16, 24, ragged_dot=lax.ragged_dot, rngs=nnx.Rngs(0))
    assert layer.kernel[...].shape == (4, 16, 24)
    keys = jax.random.split(nnx.Rngs(0).params(), 4)
    assert_trees_close(layer.kernel[...], jnp.stack([nnx.initializers.lecun_normal()(k, (16, 24)) for k in keys]), 0)
    x = jax.random.normal(jax.random.key(1), (20, 16))
    sizes = jnp.array([5, 0, 9, 6], jnp.int32)
    assert uses(lambda x: layer(x, sizes), ragged_dot_p, x)
    np.testing.assert_allclose(layer(x, sizes), ref(x, sizes), rtol=1e-5, atol=1e-5)
    g = nnx.grad(lambda m: (m(x, sizes) ** 2).sum())(layer)
    g_ref = nnx.grad(lambda m: (m(x, sizes) ** 2).sum())(ref)
    assert_trees_close(g, g_ref, 1e-4)
    # expert parallelism: a layer of 2 experts holds groups 2 and 3 of 4
    local = jcnn.GroupedLinear(2, 16, 24, rngs=nnx.Rngs(0))
    ours = local(x, sizes, group_offset=2)
    want = jax_cluster.ragged_dot(x, local.kernel[...], sizes, group_offset=2)
    np.testing.assert_allclose(ours, want, rtol=1e-6, atol=1e-6)
    assert not np.asarray(ours)[:5].any()


def _moe_pair(**kw):
    ours = jcnn.MoEMLP(16, 32, 4, 2, rngs=nnx.Rngs(0), **kw)
    ref = jcnn.MoEMLP(16, 32, 4, 2, dot_general=lax.dot_general, ragged_dot=lax.ragged_dot, rngs=nnx.Rngs(0))
    return ours, ref


def test_moe_matches_a_dense_reference_and_xla_products():
    ours, ref = _moe_pair()
    x = jax.random.normal(jax.random.key(1), (3, 8, 16))
    y = ours(x)
    np.testing.assert_allclose(y, ref(x), rtol=1e-5, atol=1e-5)
    # each token is the weighted sum of its top-2 experts' MLPs, computed densely
    tokens = x.reshape(-1, 16)
    logits = tokens @ ours.router.kernel[...]
    top, idx = lax.top_k(logits, 2)
    w = jax.nn.softmax(top, -1)
    gate, up, down = (m.kernel[...] for m in (ours.gate, ours.up, ours.down))
    expert = lambda e, t: (jax.nn.silu(t @ gate[e]) * (t @ up[e])) @ down[e]  # noqa: E731
    dense = jnp.stack([sum(w[t, s] * expert(idx[t, s], tokens[t]) for s in range(2)) for t in range(tokens.shape[0])])
    np.testing.assert_allclose(y.reshape(-1, 16), dense, rtol=1e-4, atol=1e-4)
    g = nnx.grad(lambda m: (m(x) ** 2).sum())(ours)
    g_ref = nnx.grad(lambda m: (m(x) ** 2).sum())(ref)
    assert_trees_close(g, g_ref, 1e-4)


def test_moe_fused_gate_up_is_the_same_function_with_one_product_less():
    ours, _ = _moe_pair()
    fused = jcnn.MoEMLP(16, 32, 4, 2, fuse_gate_up=True, rngs=nnx.Rngs(0))
    assert fused.gate_up.kernel[...].shape == (4, 16, 64) and not hasattr(fused, "gate")
    fused.router.kernel[...] = ours.router.kernel[...]
    fused.down.kernel[...] = ours.down.kernel[...]
    fused.gate_up.kernel[...] = jcnn.join_gate_up(ours.gate.kernel[...], ours.up.kernel[...])
    x = jax.random.normal(jax.random.key(3), (2, 8, 16))
    np.testing.assert_allclose(fused(x), ours(x), rtol=1e-5, atol=1e-5)
    count = lambda m: str(jax.make_jaxpr(lambda x: m(x))(x)).count("ragged_dot")  # noqa: E731
    assert count(fused) == count(ours) - 1
    g = nnx.grad(lambda m: (m(x) ** 2).sum())(ours)
    g_fused = nnx.grad(lambda m: (m(x) ** 2).sum())(fused)
    d_gate, d_up = jcnn.split_gate_up(g_fused["gate_up"]["kernel"][...])
    np.testing.assert_allclose(d_gate, g["gate"]["kernel"][...], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(d_up, g["up"]["kernel"][...], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(g_fused["down"]["kernel"][...], g["down"]["kernel"][...], rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="join_gate_up"):
        jcnn.join_gate_up(jnp.ones((2, 3, 4)), jnp.ones((2, 3, 5)))
    with pytest.raises(ValueError, match="split_gate_up"):
        jcnn.split_gate_up(jnp.ones((2, 3, 5)))


def test_moe_token_blocks_route_each_block_alone_with_the_same_result():
    ours, ref = _moe_pair(token_blocks=4)
    x = jax.random.normal(jax.random.key(2), (4, 6, 16))
    assert "i32[4,4]" in str(jax.make_jaxpr(lambda x: ours(x))(x)).replace(" ", "")
    np.testing.assert_allclose(ours(x), ref(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="token_blocks"):
        ours(jnp.ones((5, 16)))


def test_moe_gradients_match_the_dense_function_and_unsorting_never_collides():
    ours, _ = _moe_pair(token_blocks=2)
    router, gate, up, down = (m.kernel[...] for m in (ours.router, ours.gate, ours.up, ours.down))

    def dense(x):  # every expert on every token, then each token's top-2 picked and weighted
        tokens = x.reshape(-1, 16)
        top, idx = lax.top_k(tokens @ router, 2)
        h = jax.nn.silu(jnp.einsum("td,edh->teh", tokens, gate)) * jnp.einsum("td,edh->teh", tokens, up)
        picked = jnp.take_along_axis(jnp.einsum("teh,ehd->ted", h, down), idx[:, :, None], axis=1)
        return (picked * jax.nn.softmax(top, -1)[..., None]).sum(1).reshape(x.shape)

    x = jax.random.normal(jax.random.key(4), (2, 8, 16))
    loss = lambda f: lambda x: (f(x) ** 2).sum()  # noqa: E731
    np.testing.assert_allclose(jax.grad(loss(ours))(x), jax.grad(loss(dense))(x), rtol=1e-4, atol=1e-4)
    # the sorted rows' gathers promise unique indices: their transposes are scatters without atomics
    order, weights, sizes = jax.vmap(lambda l: jcnn.route(l, top_k=2))(jnp.ones((2, 8, 4)).cumsum(-1))
    hlo = jax.jit(jax.grad(lambda t: ours.routed(t, order, weights, sizes).sum())).lower(x).as_text()
    assert set(re.findall(r"unique_indices = (\w+)", hlo)) == {"true"}
    # an order that is no permutation is read as the permutation that sorts like it, never out of bounds
    bad = order.at[:, 0].set(order[:, 1] + 99)
    as_permutation = jnp.argsort(jnp.argsort(bad, axis=-1), axis=-1)
    np.testing.assert_array_equal(ours.routed(x, bad, weights, sizes), ours.routed(x, as_permutation, weights, sizes))


def test_route_sorts_by_expert_and_counts_groups():
    logits = jnp.array([[0.0, 2.0, 1.0], [3.0, 0.0, 1.0]])
    order, weights, sizes = jcnn.route(logits, top_k=2)
    # slots: token0 -> experts (1, 2), token1 -> experts (0, 2)
    assert sizes.tolist() == [1, 1, 2]
    assert order.tolist() == [2, 0, 1, 3]
    np.testing.assert_allclose(weights.reshape(2, 2).sum(-1), 1.0, rtol=1e-6)
    with pytest.raises(ValueError, match="top_k"):
        jcnn.route(logits, top_k=4)


@pytest.mark.parametrize("dtype,param_dtype", [(jnp.bfloat16, jnp.float32), (None, jnp.bfloat16)])
def test_grouped_linear_dtypes(dtype, param_dtype):
    kw = dict(dtype=dtype, param_dtype=param_dtype)
    layer = jcnn.GroupedLinear(3, 16, 8, rngs=nnx.Rngs(0), **kw)
    ref = jcnn.GroupedLinear(3, 16, 8, ragged_dot=lax.ragged_dot, rngs=nnx.Rngs(0), **kw)
    assert layer.kernel[...].dtype == np.dtype(param_dtype)
    x = jax.random.normal(jax.random.key(3), (12, 16), jnp.float32).astype(jnp.bfloat16)
    sizes = jnp.array([4, 4, 4], jnp.int32)
    y, want = layer(x, sizes), ref(x, sizes)
    assert y.dtype == want.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(want, np.float32), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("activation", ["relu", "gelu", "silu"])
def test_fused_activation_matches_flax_then_activation(activation):
    act = {"relu": jax.nn.relu, "gelu": jax.nn.gelu, "silu": jax.nn.silu}[activation]
    x = jax.random.normal(jax.random.key(7), (4, 6, 16))
    ours = jcnn.Linear(16, 24, activation=activation, rngs=nnx.Rngs(0))
    flaxs = nnx.Linear(16, 24, rngs=nnx.Rngs(0))
    np.testing.assert_allclose(ours(x), act(flaxs(x)), rtol=1e-5, atol=1e-5)
    g = nnx.grad(lambda m: (m(x) ** 2).sum())(ours)
    g_ref = nnx.grad(lambda m: (act(m(x)) ** 2).sum())(flaxs)
    assert_trees_close(g, g_ref, 1e-4)
    dense = jcnn.Dense(24, activation=activation)
    params = linen.Dense(24).init(jax.random.key(1), x)
    np.testing.assert_allclose(dense.apply(params, x), act(linen.Dense(24).apply(params, x)), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="unknown activation"):
        jcnn.Linear(16, 24, activation="tanh", rngs=nnx.Rngs(0))


@pytest.mark.parametrize("activation", ["none", "gelu"])
def test_layers_take_forward_mode_differentiation_as_flax_s(activation):
    act = {"none": lambda y: y, "gelu": jax.nn.gelu}[activation]
    x, dx = (jax.random.normal(jax.random.key(s), (4, 6, 16)) for s in (3, 4))
    ours = jcnn.Linear(16, 24, activation=activation, rngs=nnx.Rngs(0))
    flaxs = nnx.Linear(16, 24, rngs=nnx.Rngs(0))
    assert_trees_close(jax.jvp(ours, (x,), (dx,)), jax.jvp(lambda x: act(flaxs(x)), (x,), (dx,)), 1e-5)
    params = linen.Dense(24).init(jax.random.key(1), x)
    dense = jcnn.Dense(24, activation=activation)
    flax_dense = lambda x: act(linen.Dense(24).apply(params, x))  # noqa: E731
    got = jax.jacfwd(lambda x: dense.apply(params, x))(x[0, 0])
    assert_trees_close(got, jax.jacfwd(flax_dense)(x[0, 0]), 1e-5)
