"""A seeded random sweep of the public ops against float64 references, checked
elementwise and normwise. The CPU suite runs a few dozen cases on the XLA
paths; tests/gpu runs several hundred on the kernels.

Block-scaled fp8 cases (QArrays from `jax_cluster.quantize`, dense and
grouped, [G] and [S, G] sizes) are held to the float64 product of their
dequantized values.

A case is drawn from its index alone (`case(i)`), so a failure names a case
that reruns by itself: `pytest -k "sweep and 137"`.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from helpers import linear_reference, ragged_reference

import jax_cluster

SEED = 20261201
# sizes a kernel tiles evenly, just past a tile, and odd (odd leading dims take XLA's path)
DIMS = (8, 16, 64, 120, 128, 136, 248, 256, 264, 512, 1000, 1016, 2048)
ODD = (1, 7, 33, 129, 333)
DTYPES = (("bf16", jnp.bfloat16, None), ("f16", jnp.float16, None), ("bf16->f32", jnp.bfloat16, jnp.float32))
# (lhs contracting, rhs contracting): kn, kk and mn forms of one dot
FORMS = {"kn": ((1,), (0,)), "kk": ((1,), (1,)), "mn": ((0,), (0,)), "mk": ((0,), (1,))}
ACTIVATIONS = ("none", "relu", "gelu", "gelu_exact", "silu")
GROUPINGS = ("uniform", "skewed", "empty groups", "sum < M", "sum > M", "negative")


@dataclasses.dataclass(frozen=True)
class Case:
    index: int
    op: str
    detail: str
    run: object  # () -> (output, float64 reference, output dtype)

    def __str__(self):
        return f"case {self.index}: {self.op} {self.detail}"


def _draw(rng, shape, dtype):
    return jnp.asarray(rng.standard_normal(shape), jnp.float32).astype(dtype)


def _dim(rng, odd_share=0.15):
    return int(rng.choice(ODD)) if rng.random() < odd_share else int(rng.choice(DIMS))


def _f64(x):
    return np.asarray(jnp.asarray(x, jnp.float32), np.float64)


def _dot_case(rng, i):
    form = str(rng.choice(list(FORMS)))
    label, dtype, out = DTYPES[rng.integers(len(DTYPES))]
    m, n, k = _dim(rng), _dim(rng), _dim(rng)
    batch = int(rng.choice((0, 0, 0, 2, 3)))
    (lc,), (rc,) = FORMS[form]
    lead = (batch,) if batch else ()
    a_shape = lead + ((m, k) if lc == 1 else (k, m))
    b_shape = lead + ((k, n) if rc == 0 else (n, k))
    a, b = _draw(rng, a_shape, dtype), _draw(rng, b_shape, dtype)
    nb = len(lead)
    dims = (((lc + nb,), (rc + nb,)), (tuple(range(nb)), tuple(range(nb))))

    def run():
        got = jax.jit(lambda a, b: jax_cluster.dot_general(a, b, dims, preferred_element_type=out))(a, b)
        ref = np.asarray(jax.lax.dot_general(_f64(a), _f64(b), dims, precision="highest"), np.float64)
        return got, ref, out or dtype

    return Case(i, "dot_general", f"{form} {label} batch={batch} M={m} N={n} K={k}", run)


def _matmul_case(rng, i):
    label, dtype, out = DTYPES[rng.integers(len(DTYPES))]
    m, n, k = _dim(rng), _dim(rng), _dim(rng)
    lead = tuple(int(x) for x in rng.choice((1, 2, 3), size=rng.integers(0, 3)))
    a, b = _draw(rng, lead + (m, k), dtype), _draw(rng, (k, n), dtype)

    def run():
        got = jax.jit(lambda a, b: jax_cluster.matmul(a, b, out_dtype=out))(a, b)
        return got, _f64(a) @ _f64(b), out or dtype

    return Case(i, "matmul", f"{label} lead={lead} M={m} N={n} K={k}", run)


def group_sizes(rng, grouping, groups, rows):
    """[groups] int32 sizes of `rows` rows under one of GROUPINGS."""
    if grouping == "uniform":
        sizes = np.full(groups, rows // groups)
        sizes[: rows % groups] += 1
    elif grouping == "skewed":
        sizes = rng.multinomial(rows, rng.dirichlet(np.full(groups, 0.5)))
    elif grouping == "empty groups":
        sizes = rng.multinomial(rows, rng.dirichlet(np.ones(groups)))
        sizes[rng.choice(groups, size=max(1, groups // 2), replace=False)] = 0
    elif grouping == "sum < M":
        sizes = rng.multinomial(max(rows - int(rng.integers(1, rows + 1)), 0), np.full(groups, 1 / groups))
    elif grouping == "sum > M":
        sizes = rng.multinomial(rows + int(rng.integers(1, rows + 1)), np.full(groups, 1 / groups))
    else:  # negative: some sizes below zero, which count as 0
        sizes = rng.multinomial(rows, np.full(groups, 1 / groups))
        sizes[rng.choice(groups, size=max(1, groups // 3), replace=False)] *= -1
    return jnp.asarray(sizes, jnp.int32)


def _ragged_case(rng, i):
    grouping = str(rng.choice(GROUPINGS))
    layout = str(rng.choice(("gkn", "gnk")))
    label, dtype, out = DTYPES[rng.integers(2)]  # the grouped kernels write their input dtype
    groups = int(rng.choice((1, 2, 4, 8, 16)))
    rows, n, k = int(rng.choice((64, 256, 1000, 2048))), _dim(rng, 0.1), _dim(rng, 0.1)
    sizes = group_sizes(rng, grouping, groups, rows)
    lhs = _draw(rng, (rows, k), dtype)
    rhs = _draw(rng, (groups, k, n) if layout == "gkn" else (groups, n, k), dtype)

    def run():
        got = jax.jit(lambda x, w, s: jax_cluster.ragged_dot(x, w, s, rhs_layout=layout))(lhs, rhs, sizes)
        return got, ragged_reference(lhs, rhs, sizes, layout), dtype

    detail = f"{layout} {label} {grouping} G={groups} M={rows} N={n} K={k} sizes={np.asarray(sizes).tolist()}"
    return Case(i, "ragged_dot", detail, run)


def _linear_case(rng, i):
    activation = str(rng.choice(ACTIVATIONS))
    layout = str(rng.choice(("kn", "nk")))
    label, dtype, _ = DTYPES[rng.integers(2)]
    m, n, k = _dim(rng), _dim(rng), _dim(rng)
    with_bias, with_residual = bool(rng.integers(2)), bool(rng.integers(2))
    x = _draw(rng, (m, k), dtype)
    w = _draw(rng, (k, n) if layout == "kn" else (n, k), dtype) * (1.0 / np.sqrt(k))
    bias = _draw(rng, (n,), dtype) if with_bias else None
    residual = _draw(rng, (m, n), dtype) if with_residual else None

    def run():
        fn = jax.jit(
            lambda x, w, b, r: jax_cluster.linear(x, w, b, activation=activation, residual=r, kernel_layout=layout)
        )
        got = fn(x, w, bias, residual)
        ref = linear_reference(x, w, bias, residual, activation=activation, layout=layout)
        return got, np.asarray(ref, np.float64), dtype

    detail = f"{layout} {label} {activation} bias={with_bias} residual={with_residual} M={m} N={n} K={k}"
    return Case(i, "linear", detail, run)


def _fp8_case(rng, i):
    """matmul or ragged_dot of fp8 QArrays: activations in 1 x 128 tiles,
    weights in 128 x 128 blocks (each group's), e4m3."""
    grouped = bool(rng.integers(2))
    rows, k, n = (
        int(rng.choice((4, 64, 250, 256, 1024))),
        128 * int(rng.choice((1, 2, 4, 8))),
        128 * int(rng.choice((1, 2, 3, 8))),
    )
    x = jax_cluster.quantize(_draw(rng, (rows, k), jnp.float32))
    if not grouped:
        w = jax_cluster.quantize(_draw(rng, (k, n), jnp.float32), block=(128, 128))

        def run():
            got = jax.jit(jax_cluster.matmul)(x, w)
            return got, _f64(jax_cluster.dequantize(x)) @ _f64(jax_cluster.dequantize(w)), jnp.bfloat16

        return Case(i, "fp8 matmul", f"M={rows} N={n} K={k}", run)
    grouping = str(rng.choice(GROUPINGS))
    layout = str(rng.choice(("gkn", "gnk")))
    groups, blocks = int(rng.choice((1, 4, 8))), int(rng.choice((1, 1, 2))) if rows % 2 == 0 else 1
    sizes = jnp.stack([group_sizes(rng, grouping, groups, rows // blocks) for _ in range(blocks)])
    w = jax_cluster.quantize(
        _draw(rng, (groups, k, n) if layout == "gkn" else (groups, n, k), jnp.float32), block=(128, 128)
    )

    def run():
        given = sizes if blocks > 1 else sizes[0]
        got = jax.jit(lambda x, w, s: jax_cluster.ragged_dot(x, w, s, rhs_layout=layout))(x, w, given)
        lhs, rhs, per = jax_cluster.dequantize(x), jax_cluster.dequantize(w), rows // blocks
        ref = np.concatenate(
            [ragged_reference(lhs[b * per : (b + 1) * per], rhs, sizes[b], layout) for b in range(blocks)]
        )
        return got, ref, jnp.bfloat16

    detail = f"{layout} {grouping} S={blocks} G={groups} M={rows} N={n} K={k} sizes={np.asarray(sizes).tolist()}"
    return Case(i, "fp8 ragged_dot", detail, run)


_OPS = (_matmul_case, _dot_case, _dot_case, _ragged_case, _ragged_case, _linear_case, _fp8_case)


def case(i: int) -> Case:
    """Case `i` of the sweep, drawn from its own seed."""
    rng = np.random.default_rng([SEED, i])
    return _OPS[i % len(_OPS)](rng, i)


def check(c: Case) -> str:
    """ "" when the case passes; else what failed. Elementwise: every element
    within a few roundings of the output dtype of its reference (scaled by
    the output's RMS, so cancellation to ~0 is not held to a relative
    bound); normwise: the relative error within the same bound."""
    got, ref, out_dtype = c.run()
    got = np.asarray(jnp.asarray(got, jnp.float32), np.float64)
    if got.shape != ref.shape:
        return f"{c}: shape {got.shape}, want {ref.shape}"
    if not np.isfinite(got).all():
        return f"{c}: {int((~np.isfinite(got)).sum())} non-finite elements (unwritten or NaN)"
    if ref.size == 0:
        return ""
    # fp32 outputs carry the fp32 accumulation's error too: a floor of 2^-17
    eps = max(float(jnp.finfo(out_dtype).eps), 2.0**-17)
    rms = float(np.sqrt(np.mean(ref**2))) or 1.0
    bound = 4 * eps * (np.abs(ref) + rms)
    bad = np.abs(got - ref) > bound
    if bad.any():
        worst = np.unravel_index(np.argmax(np.abs(got - ref) / bound), ref.shape)
        return f"{c}: {int(bad.sum())} elements off, worst at {worst}: {got[worst]} vs {ref[worst]}"
    rel = np.linalg.norm(got - ref) / (np.linalg.norm(ref) or 1.0)
    if rel > 2 * eps:
        return f"{c}: relative error {rel:.2e} over {2 * eps:.1e}"
    return ""
