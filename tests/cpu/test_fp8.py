"""Block-scaled fp8 operands: quantize/dequantize, the three ops against a
float32 product of the dequantized inputs, and clear errors for operands the
recipe cannot take."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import compiled_text, fp8_accumulation_case, in_while_loops

import jax_cluster
from jax_cluster import _ffi
from jax_cluster.ops.fp8_training import Fp8Weights, fp8_grouped, fp8_linear, fp8_weights

qwix = pytest.importorskip("qwix")
nnx = pytest.importorskip("flax.nnx")
jcnn = pytest.importorskip("jax_cluster.nn")
E4M3, E5M2 = jnp.float8_e4m3fn, jnp.float8_e5m2


def _normal(key, shape):
    return jax.random.normal(jax.random.key(key), shape, jnp.float32)


def _relative(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return np.linalg.norm(out - ref) / np.linalg.norm(ref)


def test_quantize_scales_each_block_and_round_trips():
    x = _normal(0, (256, 512))
    act = jax_cluster.quantize(x)  # (1, 128): one scale per row and 128 columns
    assert isinstance(act, qwix.QArray) and act.qvalue.dtype == E4M3
    assert act.scale.shape == (256, 4) and act.scale.dtype == jnp.float32
    weight = jax_cluster.quantize(x, block=(128, 128), dtype=E5M2)
    assert weight.scale.shape == (2, 4) and weight.qvalue.dtype == E5M2
    stack = jax_cluster.quantize(_normal(1, (3, 256, 384)), block=(128, 128))
    assert stack.scale.shape == (3, 2, 3)  # each group's matrix has its own blocks
    # e4m3 keeps 3 mantissa bits: about 2-3% relative error normwise
    assert _relative(jax_cluster.dequantize(act), x) < 4e-2
    assert _relative(jax_cluster.dequantize(weight), x) < 8e-2
    assert jax_cluster.dequantize(act, jnp.bfloat16).dtype == jnp.bfloat16


@pytest.mark.parametrize(
    "kwargs,shape,error,match",
    [
        ({"block": (2, 128)}, (256, 256), ValueError, "block must be one of"),
        ({"dtype": jnp.int8}, (256, 256), TypeError, "float8_e4m3fn or float8_e5m2"),
        ({}, (256, 200), ValueError, "not multiples of the block"),
        ({"block": (128, 128)}, (100, 256), ValueError, "not multiples of the block"),
        ({}, (256,), ValueError, "at least two axes"),
    ],
)
def test_quantize_refuses_what_the_recipe_cannot_take(kwargs, shape, error, match):
    with pytest.raises(error, match=match):
        jax_cluster.quantize(jnp.ones(shape), **kwargs)


def test_dequantize_takes_only_qarrays():
    with pytest.raises(TypeError, match="QArray"):
        jax_cluster.dequantize(jnp.ones((4, 4)))


def _operands(m=64, k=256, n=384, rhs_dtype=E4M3):
    a, b = _normal(2, (m, k)), _normal(3, (k, n))
    qa, qb = jax_cluster.quantize(a), jax_cluster.quantize(b, block=(128, 128), dtype=rhs_dtype)
    ref = jax_cluster.dequantize(qa) @ jax_cluster.dequantize(qb)  # float32 product of what fp8 holds
    return a, b, qa, qb, ref


@pytest.mark.parametrize("rhs_dtype", [E4M3, E5M2])
def test_matmul_of_fp8_operands_is_the_product_of_their_values(rhs_dtype):
    a, b, qa, qb, ref = _operands(rhs_dtype=rhs_dtype)
    out = jax.jit(jax_cluster.matmul)(qa, qb)
    assert out.dtype == jnp.bfloat16 and out.shape == (64, 384)
    # the dequantized values round to bf16 on the bf16 path: a tight bound
    assert _relative(out, ref) < 1e-2
    # against the bf16 product of the unquantized inputs: fp8's own rounding
    bf16 = jnp.matmul(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16), preferred_element_type=jnp.float32)
    assert 1e-2 < _relative(out, bf16) < 1.2e-1
    wide = jax_cluster.matmul(qa, qb, out_dtype=jnp.float32)
    assert wide.dtype == jnp.float32 and _relative(wide, ref) < 1e-2


@pytest.mark.parametrize("weight_layout", ["kn", "nk"])
def test_dot_general_takes_fp8_in_the_matmul_form(weight_layout):
    a, b, qa, qb, ref = _operands()
    if weight_layout == "nk":
        qb = jax_cluster.quantize(jax_cluster.dequantize(qb).T, block=(128, 128))
        dims = (((1,), (1,)), ((), ()))
    else:
        dims = (((1,), (0,)), ((), ()))
    out = jax_cluster.dot_general(qa, qb, dims)
    assert out.dtype == jnp.bfloat16 and _relative(out, ref) < 1e-2
    with pytest.raises(ValueError, match="matmul form only"):
        jax_cluster.dot_general(qa, qb, (((0,), (0,)), ((), ())))


@pytest.mark.parametrize("rhs_layout", ["gkn", "gnk"])
def test_ragged_dot_of_fp8_operands_is_the_grouped_product_of_their_values(rhs_layout):
    sizes = jnp.array([40, 0, 100, 60], jnp.int32)  # an empty group, rows past the last
    lhs = jax_cluster.quantize(_normal(4, (256, 256)))
    weights = _normal(5, (4, 256, 384) if rhs_layout == "gkn" else (4, 384, 256))
    rhs = jax_cluster.quantize(weights, block=(128, 128))
    out = jax.jit(lambda l, r, s: jax_cluster.ragged_dot(l, r, s, rhs_layout=rhs_layout))(lhs, rhs, sizes)
    values = jax_cluster.dequantize(rhs)
    values = values if rhs_layout == "gkn" else jnp.swapaxes(values, 1, 2)
    ref = jax.lax.ragged_dot(jax_cluster.dequantize(lhs), values, sizes, precision="highest")
    assert out.dtype == jnp.bfloat16 and _relative(out, ref) < 1e-2
    assert not np.asarray(out[200:]).any()  # rows past the last group stay zero


def test_fp8_operands_must_come_in_pairs_and_in_the_recipes_blocks():
    _, b, qa, qb, _ = _operands()
    with pytest.raises(TypeError, match="quantize both operands"):
        jax_cluster.matmul(qa, b)
    with pytest.raises(ValueError, match="rhs must be scaled in 128x128 blocks"):
        jax_cluster.matmul(qa, jax_cluster.quantize(b))  # a weight in activation tiles
    with pytest.raises(ValueError, match="lhs must be scaled in 1x128 blocks"):
        jax_cluster.matmul(jax_cluster.quantize(_normal(6, (128, 256)), block=(128, 128)), qb)
    with pytest.raises(TypeError, match="scales must be float32"):
        jax_cluster.matmul(dataclasses.replace(qa, scale=qa.scale.astype(jnp.bfloat16)), qb)
    with pytest.raises(ValueError, match="do not tile"):
        jax_cluster.matmul(dataclasses.replace(qa, scale=jnp.ones((64, 3), jnp.float32)), qb)
    int8 = qwix.quantize(_normal(7, (64, 256)), jnp.int8, channelwise_axes=(0,), tiled_axes={1: 128})
    with pytest.raises(TypeError, match="quantize both operands"):  # int8 is dequantized: a plain lhs
        jax_cluster.matmul(int8, qb)
    with pytest.raises(TypeError, match="quantize both operands"):
        jax_cluster.ragged_dot(qa, jnp.ones((2, 256, 128)), jnp.array([32, 32], jnp.int32))


def _int_quantized(key, shape, qtype, **how):
    return qwix.quantize(_normal(key, shape).astype(jnp.bfloat16), qtype, **how)


# (qtype, how a [K, N] weight is quantized, how a [G, K, N] stack is)
INTEGER_QUANTIZATIONS = [
    ("int8", {"channelwise_axes": (1,)}, {"channelwise_axes": (0, 2)}),  # per output column: weight-only int8
    ("int4", {"tiled_axes": {0: 32}}, {"channelwise_axes": (0,), "tiled_axes": {1: 32}}),  # blocks along K
    ("int8", {"channelwise_axes": (1,), "calibration_method": "minmax"}, {"calibration_method": "minmax"}),
]


@pytest.mark.parametrize("qtype,weight_how,stack_how", INTEGER_QUANTIZATIONS)
def test_integer_qarrays_run_as_their_values(qtype, weight_how, stack_how):
    """qwix's int8 / int4 QArrays (any tiling, zero points too) have no
    kernel: each op takes the values they stand for, alone or in pairs."""
    a = _normal(8, (64, 256)).astype(jnp.bfloat16)
    w = _int_quantized(9, (256, 128), qtype, **weight_how)
    values = qwix.dequantize(w)
    assert values.dtype == jnp.bfloat16
    want = jnp.matmul(a, values, preferred_element_type=jnp.float32)
    out = jax.jit(jax_cluster.matmul)(a, w)
    assert out.dtype == jnp.bfloat16 and _relative(out, want) < 1e-2
    out = jax_cluster.dot_general(a, w, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    assert out.dtype == jnp.float32 and _relative(out, want) < 1e-2
    qa = _int_quantized(10, (64, 256), "int8", channelwise_axes=(0,))
    both = jnp.matmul(qwix.dequantize(qa), values, preferred_element_type=jnp.float32)
    assert _relative(jax_cluster.matmul(qa, w), both) < 1e-2

    sizes = jnp.array([10, 0, 30], jnp.uint8)  # rows past the last group
    stack = _int_quantized(11, (3, 256, 128), qtype, **stack_how)
    values = qwix.dequantize(stack).astype(jnp.float32)
    ref = jax.lax.ragged_dot(a.astype(jnp.float32), values, sizes.astype(jnp.int32))
    out = jax.jit(jax_cluster.ragged_dot)(a, stack, sizes)
    assert out.dtype == jnp.bfloat16 and _relative(out, ref) < 1e-2
    assert not np.asarray(out[40:]).any()


# --------------------------------------------------------------------------- the training recipe


def _grads(fn, *args):
    return jax.grad(lambda *a: (fn(*a).astype(jnp.float32) ** 2).sum(), argnums=(0, 1))(*args)


@pytest.mark.parametrize("recipe", ["blockwise", "mxfp8"])
def test_the_fp8_recipe_differentiates_close_to_bf16(recipe):
    x = _normal(8, (256, 384)).astype(jnp.bfloat16)
    w = (_normal(9, (384, 512)) * 0.05).astype(jnp.bfloat16)
    ours = _grads(lambda x, w: fp8_linear(x, w, recipe), x, w)
    ref = _grads(lambda x, w: x @ w, x, w)
    for got, want in zip(ours, ref):
        assert got.dtype == want.dtype == jnp.bfloat16
        assert _relative(got, want) < 8e-2  # e4m3 on all three products: about 4-5%
    sizes = jnp.array([100, 28, 0, 128], jnp.int32)  # a 128-row token tile straddles two groups
    wg = (_normal(10, (4, 384, 512)) * 0.05).astype(jnp.bfloat16)
    ours = jax.jit(lambda x, w: _grads(lambda x, w: fp8_grouped(x, w, sizes, recipe), x, w))(x, wg)
    ref = _grads(lambda x, w: jax.lax.ragged_dot(x, w, sizes), x, wg)
    for got, want in zip(ours, ref):
        assert _relative(got, want) < 8e-2
    assert not np.asarray(ours[1][2], np.float32).any()  # the empty group gets no gradient


def test_the_blockwise_recipe_quantizes_each_weight_once_into_both_layouts():
    """One weight-block quantization per step and weight (and, dense, one of
    dy for the weight gradient): the forward reads the weight's transposed
    layout, the input gradient the as-stored one it saved."""
    x = _normal(16, (256, 256)).astype(jnp.bfloat16)
    w = (_normal(17, (256, 384)) * 0.05).astype(jnp.bfloat16)
    wg = (_normal(18, (2, 256, 384)) * 0.05).astype(jnp.bfloat16)
    sizes = jnp.array([200, 56], jnp.int32)
    # dense: the weight's and dy's 128 x 128 blocks (the weight gradient's), each once; grouped: the weight's
    cases = ((lambda x, w: fp8_linear(x, w), w, 2), (lambda x, w: fp8_grouped(x, w, sizes), wg, 1))
    for fn, weight, count in cases:
        text = str(jax.make_jaxpr(lambda x, w, fn=fn: _grads(fn, x, w))(x, weight))
        assert text.count("jax_cluster_quantize_weight_blocks") == count
    assert "jax_cluster_quantize_token_tiles" in str(jax.make_jaxpr(lambda x, w: _grads(fp8_linear, x, w))(x, w))
    # a vmapped step: each quantization primitive batches (the token tiles one call per element)
    batched = jax.vmap(lambda x, w: _grads(fp8_linear, x, w))(jnp.stack([x, x * 2]), jnp.stack([w, w]))
    np.testing.assert_array_equal(
        np.asarray(batched[1][0], np.float32), np.asarray(_grads(fp8_linear, x, w)[1], np.float32)
    )
    # the forward alone writes the same numbers as the training step's forward
    y, vjp = jax.vjp(lambda w: fp8_linear(x, w), w)
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(fp8_linear(x, w), np.float32))
    assert vjp(jnp.ones_like(y))[0].shape == w.shape


def test_the_mx_recipe_binds_mx_blocks_and_refuses_e5m2_gradients():
    x = _normal(14, (128, 256)).astype(jnp.bfloat16)
    w = (_normal(15, (256, 128)) * 0.05).astype(jnp.bfloat16)
    text = str(jax.make_jaxpr(lambda x, w: _grads(lambda x, w: fp8_linear(x, w, "mxfp8"), x, w))(x, w))
    assert "float8_e8m0fnu" in text and "float8_e4m3fn" in text  # MX scales on e4m3 values
    with pytest.raises(TypeError, match=r"mxfp8 takes gradients in \['float8_e4m3fn'\]"):
        fp8_linear(x, w, "mxfp8", jnp.float8_e5m2)
    assert _relative(fp8_linear(x, w, "blockwise", jnp.float8_e5m2), x @ w) < 8e-2


def test_fp8_layers_take_the_recipe_and_refuse_what_it_cannot_run():
    layer = jcnn.Linear(256, 384, fp8="blockwise", activation="gelu", dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    plain = jcnn.Linear(256, 384, activation="gelu", dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    x = _normal(11, (2, 64, 256))
    assert _relative(layer(x), plain(x)) < 6e-2
    grads = nnx.grad(lambda m: (m(x).astype(jnp.float32) ** 2).sum())(layer)
    assert grads["kernel"][...].shape == (256, 384) and grads["bias"][...].shape == (384,)
    with pytest.raises(ValueError, match="multiples of 128"):
        layer(_normal(12, (100, 256)))
    with pytest.raises(ValueError, match="fp8 must be None or one of"):
        jcnn.Linear(256, 384, fp8="tensorwise", rngs=nnx.Rngs(0))
    ref = jcnn.MoEMLP(128, 256, 4, 2, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    tokens = _normal(13, (2, 64, 128))
    for recipe in ("blockwise", "mxfp8"):
        moe = jcnn.MoEMLP(128, 256, 4, 2, fp8=recipe, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
        assert _relative(moe(tokens), ref(tokens)) < 8e-2
        # token blocks (the data-parallel form) train too
        blocked = jcnn.MoEMLP(128, 256, 4, 2, fp8=recipe, token_blocks=2, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
        grads = nnx.grad(lambda m: (m(tokens).astype(jnp.float32) ** 2).sum())(blocked)
        assert _relative(blocked(tokens), ref(tokens)) < 8e-2 and grads["down"]["kernel"][...].shape == (4, 256, 128)
    mx = jcnn.Linear(256, 384, fp8="mxfp8", activation="gelu", dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    assert _relative(mx(x), plain(x)) < 6e-2


@pytest.mark.parametrize("planned_for", ["cpu", "h200"])
@pytest.mark.parametrize("recipe", ["blockwise", "mxfp8"])
def test_the_grouped_recipe_takes_token_blocks(recipe, planned_for, monkeypatch):
    """[S, G] sizes (MoEMLP's token_blocks, the data-parallel form): each
    block as its own call, forward and both gradients, on the dequantized
    path (a CPU's plans) and on the block-scaled ops (an H200's plans, run
    here by their float32 fallback)."""
    if planned_for == "h200":
        from jax_cluster.planning.device import DeviceInfo
        from jax_cluster.primitives import plans

        device = DeviceInfo("cuda", "described H200", (9, 0), 132, 232448, 50 << 20)
        real = plans.fresh
        monkeypatch.setattr(plans, "fresh", lambda call, _: real(call, device))
    blocks, rows = 2, 256
    x = _normal(30, (blocks * rows, 256)).astype(jnp.bfloat16)
    w = (_normal(31, (4, 256, 384)) * 0.05).astype(jnp.bfloat16)
    sizes = jnp.array([[64, 100, 0, 60], [10, 28, 120, 98]], jnp.int32)
    layer = jax.jit(lambda x, w, s: fp8_grouped(x, w, s, recipe))
    grads = jax.jit(lambda x, w, s: _grads(lambda x, w: fp8_grouped(x, w, s, recipe), x, w))
    if planned_for == "h200" and recipe == "blockwise" and _ffi.compiled_variant_names():
        assert "jax_cluster_scaled_ragged_dot" in str(jax.make_jaxpr(grads)(x, w, sizes))
    out, (dx, dw) = layer(x, w, sizes), grads(x, w, sizes)
    parts = [
        (layer(x[b * rows : (b + 1) * rows], w, sizes[b]), grads(x[b * rows : (b + 1) * rows], w, sizes[b]))
        for b in range(blocks)
    ]
    np.testing.assert_array_equal(
        np.asarray(out, np.float32), np.concatenate([np.asarray(p[0], np.float32) for p in parts])
    )
    np.testing.assert_array_equal(
        np.asarray(dx, np.float32), np.concatenate([np.asarray(p[1][0], np.float32) for p in parts])
    )
    # the blocks' weight gradients are summed in float32, then rounded once
    assert _relative(dw, sum(np.asarray(p[1][1], np.float32) for p in parts)) < 5e-3


@pytest.mark.parametrize("recipe", ["blockwise", "mxfp8"])
def test_the_grouped_recipe_takes_group_offset(recipe):
    """Expert parallelism in fp8: the kernel holds 2 of 6 experts; rows of
    the others come out zero with zero input gradients, and the local
    experts' products and weight gradients are those of their own rows."""
    sizes, offset, local = jnp.array([100, 50, 128, 128, 66, 40], jnp.int32), 2, 2
    x = _normal(40, (512, 256)).astype(jnp.bfloat16)
    w = (_normal(41, (local, 256, 384)) * 0.05).astype(jnp.bfloat16)
    ct = _normal(42, (512, 384))
    first, last = 150, 406  # the local experts' rows (256: the recipe takes rows in 128s)

    def loss(x, w):
        return (fp8_grouped(x, w, sizes, recipe, E4M3, offset).astype(jnp.float32) * ct).sum()

    out = jax.jit(lambda x, w: fp8_grouped(x, w, sizes, recipe, E4M3, offset))(x, w)
    dx, dw = jax.jit(jax.grad(loss, (0, 1)))(x, w)
    for rows in (slice(0, first), slice(last, None)):
        assert not np.asarray(out, np.float32)[rows].any() and not np.asarray(dx, np.float32)[rows].any()
    # the same experts on their own rows, without an offset
    mine = sizes[offset : offset + local]
    alone = jax.jit(lambda x, w: fp8_grouped(x, w, mine, recipe))(x[first:last], w)
    np.testing.assert_array_equal(np.asarray(out, np.float32)[first:last], np.asarray(alone, np.float32))
    ct_mine = ct[first:last]
    grads = jax.grad(lambda x, w: (fp8_grouped(x, w, mine, recipe).astype(jnp.float32) * ct_mine).sum(), (0, 1))
    dx_alone, dw_alone = jax.jit(grads)(x[first:last], w)
    np.testing.assert_array_equal(np.asarray(dx, np.float32)[first:last], np.asarray(dx_alone, np.float32))
    # the same rows on other token tiles, so other scales: two quantizations
    # of one product (each about 4% from the unquantized one)
    assert _relative(dw, dw_alone) < 4e-2


def test_gradient_accumulation_quantizes_the_weights_once_per_step():
    """Micro-batches in a lax.scan over one set of weights: XLA moves the
    weights' block quantization (its amax, f32[G, K/128, N/128]) out of the
    loop, so it is paid once per step, not once per micro-batch."""
    accumulate, weight_gradient, w, xs = fp8_accumulation_case()
    groups, k, n = w.shape
    hlo = compiled_text(jax.jit(accumulate), w, xs)
    amax = f"f32[{groups},{k // 128},{n // 128}]"
    assert amax in hlo and " while(" in hlo
    assert not in_while_loops(hlo, amax)
    # the check sees a quantization that stays in the loop: weights that change per micro-batch
    moving = jax.jit(lambda w, xs: jax.lax.map(lambda x: weight_gradient(x, w + x[0, 0]), xs))
    assert in_while_loops(compiled_text(moving, w, xs), amax)
    want = sum(weight_gradient(x, w) for x in xs)
    assert _relative(jax.jit(accumulate)(w, xs), want) < 1e-5


@pytest.mark.parametrize("recipe", ["blockwise", "mxfp8"])
def test_weights_quantized_ahead_give_the_same_step(recipe):
    """fp8_weights made once and passed to the calls: the outputs and both
    gradients of the calls that quantize their kernels, bit for bit."""
    x = _normal(32, (256, 256)).astype(jnp.bfloat16)
    w = (_normal(33, (256, 384)) * 0.05).astype(jnp.bfloat16)
    wg = (_normal(34, (4, 256, 384)) * 0.05).astype(jnp.bfloat16)
    sizes = jnp.asarray([100, 28, 0, 128], jnp.int32)
    dense = lambda x, w, q: fp8_linear(x, w, recipe, E4M3, q)  # noqa: E731
    grouped = lambda x, w, q: fp8_grouped(x, w, sizes, recipe, E4M3, None, q)  # noqa: E731
    for fn, weight in ((dense, w), (grouped, wg)):

        def step(x, w, ahead, fn=fn):
            q = fp8_weights(w, recipe) if ahead else None
            loss = lambda x, w: (fn(x, w, q).astype(jnp.float32) ** 2).sum()  # noqa: E731
            return jax.value_and_grad(loss, argnums=(0, 1))(x, w)

        run = jax.jit(step, static_argnums=2)
        got, want = jax.tree.leaves(run(x, weight, True)), jax.tree.leaves(run(x, weight, False))
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
        q = fp8_weights(weight, recipe)
        assert isinstance(q, Fp8Weights) and q.shape == weight.shape and q.recipe == recipe
        assert len(jax.tree.leaves(q)) == 4  # each layout's values and scales


def _weight_quantizations(closed_jaxpr) -> tuple[int, int]:
    """The weight-block quantizations a step with one lax.scan binds outside
    the scan and inside its body."""
    name = "jax_cluster_quantize_weight_blocks"
    eqns = closed_jaxpr.jaxpr.eqns
    (scan,) = [e for e in eqns if e.primitive.name == "scan"]
    return sum(name in e.primitive.name for e in eqns), str(scan.params["jaxpr"]).count(name)


def test_weights_quantized_ahead_leave_the_accumulation_loop():
    """Quantized before a gradient-accumulation scan, the weights' block
    quantization is outside the loop by construction, whatever the compiler
    hoists; quantized per call, each micro-batch binds its own."""
    for ahead, outside, inside in ((True, 1, 0), (False, 0, 1)):
        accumulate, weight_gradient, w, xs = fp8_accumulation_case(ahead)
        assert _weight_quantizations(jax.make_jaxpr(accumulate)(w, xs)) == (outside, inside)
    got = jax.jit(fp8_accumulation_case(True)[0])(w, xs)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.jit(accumulate)(w, xs)))


def test_weights_quantized_ahead_must_match_the_call():
    w = (_normal(35, (256, 384)) * 0.05).astype(jnp.bfloat16)
    x = _normal(36, (128, 256)).astype(jnp.bfloat16)
    with pytest.raises(ValueError, match="made for a \\(256, 384\\) kernel in the mxfp8 recipe"):
        fp8_linear(x, w, "blockwise", E4M3, fp8_weights(w, "mxfp8"))
    with pytest.raises(ValueError, match="made for a \\(256, 256\\) kernel"):
        fp8_linear(x, w, "blockwise", E4M3, fp8_weights(w[:, :256]))
    with pytest.raises(TypeError, match="must come from fp8_weights"):
        fp8_linear(x, w, "blockwise", E4M3, jax_cluster.quantize_weight(w))
    with pytest.raises(ValueError, match="fp8 must be None or one of"):
        fp8_weights(w, "tensorwise")
    plain = jcnn.Linear(256, 384, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="needs a recipe"):
        plain.fp8_weights()
    with pytest.raises(ValueError, match="needs a layer made with fp8="):
        plain(x, fp8_weights=fp8_weights(w))
    # the fused gate/up layer without a recipe, whose epilogue path never calls the layer's product
    fused = jcnn.MoEMLP(256, 128, 4, 2, fuse_gate_up=True, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    ahead = {"gate_up": fp8_weights(fused.gate_up.kernel[...]), "down": fp8_weights(fused.down.kernel[...])}
    with pytest.raises(ValueError, match="needs a layer made with fp8="):
        fused(x, fp8_weights=ahead)


@pytest.mark.parametrize("fuse_gate_up", [False, True])
def test_fp8_layers_take_weights_quantized_ahead(fuse_gate_up):
    """Linear and MoEMLP given their own fp8_weights(): the same outputs and
    parameter gradients as quantizing on every call."""
    x = _normal(37, (2, 128, 256))
    layer = jcnn.Linear(256, 384, fp8="blockwise", dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    moe = jcnn.MoEMLP(256, 128, 4, 2, fp8="blockwise", fuse_gate_up=fuse_gate_up, dtype=jnp.bfloat16, rngs=nnx.Rngs(1))
    for model in (layer, moe):
        ahead = model.fp8_weights()

        def loss(m, ahead):
            return (m(x, fp8_weights=ahead).astype(jnp.float32) ** 2).sum()

        got = nnx.value_and_grad(loss)(model, ahead)
        want = nnx.value_and_grad(loss)(model, None)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    assert set(moe.fp8_weights()) == ({"gate_up", "down"} if fuse_gate_up else {"gate", "up", "down"})
    with pytest.raises(ValueError, match="a dict of"):
        moe(x, fp8_weights={"down": moe.down.fp8_weights()})


def test_a_moe_step_accumulates_micro_batches_on_weights_quantized_once():
    """The README's gradient-accumulation step: the layer split, its kernels
    quantized before the scan, each micro-batch merging the parameters and
    reading the quantized kernels. One quantization per expert product, all
    outside the loop; the gradients of quantizing in every micro-batch."""
    moe = jcnn.MoEMLP(256, 128, 4, 2, fp8="blockwise", dtype=jnp.bfloat16, rngs=nnx.Rngs(2))
    batches = _normal(38, (3, 128, 256))

    def step(batches, ahead):
        graph, params = nnx.split(moe)
        q = moe.fp8_weights() if ahead else None

        def micro_batch(grads, batch):
            loss = lambda p: (nnx.merge(graph, p)(batch, fp8_weights=q).astype(jnp.float32) ** 2).sum()  # noqa: E731
            return jax.tree.map(jnp.add, grads, jax.grad(loss)(params)), None

        return jax.lax.scan(micro_batch, jax.tree.map(jnp.zeros_like, params), batches)[0]

    assert _weight_quantizations(jax.make_jaxpr(step, static_argnums=1)(batches, True)) == (3, 0)
    run = jax.jit(step, static_argnums=1)
    for a, b in zip(jax.tree.leaves(run(batches, True)), jax.tree.leaves(run(batches, False)), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
