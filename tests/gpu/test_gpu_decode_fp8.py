"""The block-scaled decode rows on a Hopper GPU, each pinned: fp8 rows in 1 x 128
tiles times each group's fp8 weight [N, K] in 128 x 128 blocks, against the
float32 product of the dequantized operands, on the shapes whose work items
and size rules a decode kernel must get right, with NaN-poisoned outputs
(conftest) and bitwise-repeatable results."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import fresh_key

import jax_cluster
from jax_cluster import _ffi
from jax_cluster.planning import tables
from jax_cluster.primitives.lowering import xla_scaled_ragged
from jax_cluster.primitives.scaled_ragged import scaled_ragged_dot
from jax_cluster.tools.selftest import scaled_grouped_operands

pytestmark = pytest.mark.gpu
ROWS = [v.name for v in tables.load_menu() if v.kind == "decode" and v.dtype in tables.BLOCK_SCALED_DTYPES]
# (name, M, K, N, sizes): K in whole scale blocks, N a multiple of 8
CASES = [
    ("one row per group", 8, 2048, 768, [1] * 8 + [0] * 120),
    ("two rows per group", 64, 1024, 512, [2] * 32),
    ("groups longer than an item", 300, 512, 264, [0, 1, 150, 0, 9, 140]),
    ("N across two scale blocks, off the tile", 24, 384, 200, [3, 0, 21]),
    ("sum < M, empty groups", 100, 256, 256, [0, 30, 0, 20]),
    ("sum > M", 64, 256, 512, [40, 40, 40]),
    ("negative sizes", 64, 256, 256, [-5, 20, -1, 30]),
    ("sizes near int32 max", 16, 128, 128, [2**31 - 1, 5, 2**31 - 1]),
    ("K blocks split unevenly", 40, 640, 264, [10, 0, 30]),
    ("fewer K blocks than CTAs", 12, 128, 64, [4, 8]),
    ("one row", 1, 128, 64, [1]),
    ("every group empty", 16, 128, 128, [0, 0, 0]),
    ("1024 groups", 512, 256, 256, [(g * 7) % 3 for g in range(1024)]),
]


def _bits(x):
    return np.asarray(x).view(np.uint16)


@pytest.mark.parametrize("variant", ROWS)
@pytest.mark.parametrize("name,m,k,n,sizes", CASES, ids=[c[0] for c in CASES])
def test_block_scaled_decode_rows(name, m, k, n, sizes, variant):
    if variant not in _ffi.compiled_variant_names():
        pytest.skip(f"{variant} is not in this build")
    groups = len(sizes)
    plan = jax_cluster.plan_ragged(
        m, n, k, groups, problem="ragged_m", dtype="e4m3", out_dtype=jnp.bfloat16, b_major="k", variant=variant
    )
    assert plan.variant == variant, plan.reason
    operands = scaled_grouped_operands(fresh_key(), m, n, k, groups, jnp.float8_e4m3fn)
    gs = jnp.asarray(sizes, jnp.int32)
    run = jax.jit(lambda *xs: scaled_ragged_dot(*xs, out_dtype=jnp.bfloat16, plan=plan))
    out = run(*operands, gs)
    ref = np.asarray(xla_scaled_ragged(*operands, gs, out_dtype=jnp.float32, plan=plan), np.float64)
    got = np.asarray(out, np.float64)
    if np.abs(ref).max() > 0:
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 5e-3
    # elementwise: each element within a few bf16 roundings of its row's scale
    scale = np.abs(ref).max(axis=1, keepdims=True) + 1e-30
    assert np.all(np.abs(got - ref) <= 4 * 2**-8 * scale)
    covered = min(m, int(np.clip(np.asarray(sizes, np.int64), 0, None).sum()))
    assert np.all(got[covered:] == 0), "rows past the groups must be 0"
    assert np.array_equal(_bits(out), _bits(run(*operands, gs))), "not deterministic"


def test_block_scaled_decode_rows_refuse_more_groups_than_their_table():
    if not ROWS or ROWS[0] not in _ffi.compiled_variant_names():
        pytest.skip("no block-scaled decode row in this build")
    groups = tables.DECODE_MAX_GROUPS + 1
    plan = jax_cluster.plan_ragged(
        64, 256, 256, groups, problem="ragged_m", dtype="e4m3", out_dtype=jnp.bfloat16, b_major="k", variant=ROWS[0]
    )
    assert plan.path == "xla" and str(tables.DECODE_MAX_GROUPS) in plan.reason
