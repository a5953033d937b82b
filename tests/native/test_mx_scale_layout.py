"""The MX scales' layout (primitives/mx_scales.py) against CUTLASS's own:
a host program asks CuTe's Sm1xxBlockScaledConfig for the byte of every
(row, K block) of A's and B's scale factors, and the Python reordering must
put each scale there. No GPU: CuTe's layouts are host code."""

import importlib.util
import pathlib
import shutil
import subprocess

import jax.numpy as jnp
import numpy as np
import pytest

from jax_cluster.planning.tables import MX_SCALE_BLOCK
from jax_cluster.primitives import mx_scales

NVCC = shutil.which("nvcc") or next((str(p) for p in pathlib.Path("/usr/local/cuda/bin").glob("nvcc")), None)
CUTLASS = importlib.util.find_spec("cutlass_library")
# (M, N, K): padding in rows and in K blocks, several atoms each way
SHAPES = [(128, 256, 128), (300, 136, 544), (1000, 8, 4128)]

PROGRAM = """\
#include <cstdio>
#include <cstdlib>
#include <cutlass/detail/sm100_blockscaled_layout.hpp>

// Prints, for A (0) and B (1), every (row, K block) and the byte CUTLASS reads it from.
int main(int argc, char** argv) {
  int m = std::atoi(argv[1]), n = std::atoi(argv[2]), k = std::atoi(argv[3]);
  using Config = cutlass::detail::Sm1xxBlockScaledConfig<%(block)d>;
  auto shape = cute::make_shape(m, n, k, 1);
  auto sfa = Config::tile_atom_to_shape_SFA(shape);
  auto sfb = Config::tile_atom_to_shape_SFB(shape);
  for (int r = 0; r < m; ++r)
    for (int kb = 0; kb * %(block)d < k; ++kb) std::printf("0 %%d %%d %%d\\n", r, kb, int(sfa(r, kb * %(block)d, 0)));
  for (int r = 0; r < n; ++r)
    for (int kb = 0; kb * %(block)d < k; ++kb) std::printf("1 %%d %%d %%d\\n", r, kb, int(sfb(r, kb * %(block)d, 0)));
  std::printf("size %%d %%d\\n", int(cute::size(cute::filter_zeros(sfa))), int(cute::size(cute::filter_zeros(sfb))));
}
"""


@pytest.fixture(scope="module")
def cutlass_layout(tmp_path_factory):
    if NVCC is None or CUTLASS is None:
        pytest.skip("needs nvcc and the nvidia-cutlass headers")
    include = pathlib.Path(CUTLASS.origin).parent / "source" / "include"
    folder = tmp_path_factory.mktemp("mx_layout")
    source, binary = folder / "layout.cu", folder / "layout"
    source.write_text(PROGRAM % {"block": MX_SCALE_BLOCK})
    subprocess.run([NVCC, "-std=c++17", "-I", str(include), "-o", str(binary), str(source)], check=True)

    def offsets(m, n, k):
        lines = subprocess.run([str(binary), str(m), str(n), str(k)], check=True, capture_output=True, text=True)
        *rows, size = lines.stdout.splitlines()
        table = np.array([list(map(int, row.split())) for row in rows])
        return table, tuple(map(int, size.split()[1:]))

    return offsets


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_the_scales_sit_where_cutlass_reads_them(cutlass_layout, m, n, k):
    table, (size_a, size_b) = cutlass_layout(m, n, k)
    assert (size_a, size_b) == (mx_scales.layout_size(m, k), mx_scales.layout_size(n, k))
    for operand, rows in ((0, m), (1, n)):
        part = table[table[:, 0] == operand]
        blocks = -(-k // MX_SCALE_BLOCK)
        # a distinct e8m0 code for every (row, K block): where the reordering puts it
        codes = (np.arange(rows * blocks) % 250).reshape(rows, blocks).astype(np.uint8)
        laid = np.asarray(mx_scales.to_kernel_layout(jnp.asarray(codes).view(jnp.float8_e8m0fnu), k).view(jnp.uint8))
        np.testing.assert_array_equal(laid[part[:, 3]], codes[part[:, 1], part[:, 2]])


def test_each_group_of_a_grouped_a_sits_where_its_own_layout_reads_it(cutlass_layout):
    """The MX grouped kernel reads group g's scales from byte aligned_start_g *
    row bytes (the earlier groups' rows, each rounded up to 128) through
    CuTe's layout of the group's own [M_g, K]: the grouped reordering must
    put every scale there."""
    rows, n, k = 300, 8, 544
    sizes = np.array([0, 1, 130, 77, 0, 60])  # 32 rows are past every group
    blocks, row_bytes = -(-k // MX_SCALE_BLOCK), mx_scales.padded_shape(1, k)[1]
    codes = (np.arange(rows * blocks) % 250).reshape(rows, blocks).astype(np.uint8)
    laid = mx_scales.grouped_to_kernel_layout(jnp.asarray(codes).view(jnp.float8_e8m0fnu), jnp.asarray(sizes), k)
    laid = np.asarray(laid.view(jnp.uint8))
    first, aligned = 0, 0
    for size in sizes:
        if size:
            table, _ = cutlass_layout(int(size), n, k)
            part = table[table[:, 0] == 0]  # A: (row of the group, K block, byte)
            np.testing.assert_array_equal(laid[aligned * row_bytes + part[:, 3]], codes[first + part[:, 1], part[:, 2]])
        first, aligned = first + size, aligned + -(-size // 128) * 128


TOKEN_PROGRAM = """\
#include <cstdio>
#include <cstdlib>
#include <cutlass/detail/sm100_blockscaled_layout.hpp>

// The MX weight gradient's per-group scale layout: the group's shape with the
// whole operand's strides, from the group's first K tile. Prints, for each
// (row, K block of the group), the byte of the whole layout it reads.
int main(int argc, char** argv) {
  int m = std::atoi(argv[1]), whole = std::atoi(argv[2]), start = std::atoi(argv[3]);
  int tokens = std::atoi(argv[4]);
  using Config = cutlass::detail::Sm1xxBlockScaledConfig<%(block)d>;
  auto all = Config::tile_atom_to_shape_SFA(cute::make_shape(m, 1, whole, 1));
  auto own = Config::tile_atom_to_shape_SFA(cute::make_shape(m, 1, tokens, 1));
  auto group = cute::make_layout(own.shape(), all.stride());
  int first = start / 128 * 512;
  for (int r = 0; r < m; ++r)
    for (int kb = 0; kb * %(block)d < tokens; ++kb)
      std::printf("%%d %%d %%d\\n", r, kb, first + int(group(r, kb * %(block)d, 0)));
}
"""


def test_each_group_of_the_weight_gradient_reads_its_columns_of_the_whole_layout(tmp_path):
    """The MX ragged_k kernel reads group g's scales through a layout of the
    group's own shape with the whole operand's strides, from the group's
    first token tile on (kernels/cutlass_grouped_gemm.cuh,
    GroupedMxTokenOperands); the whole operand's scales are one
    to_kernel_layout, so each group's (row, K block) must land on the byte
    of (row, start/32 + K block)."""
    if NVCC is None or CUTLASS is None:
        pytest.skip("needs nvcc and the nvidia-cutlass headers")
    include = pathlib.Path(CUTLASS.origin).parent / "source" / "include"
    source, binary = tmp_path / "token_layout.cu", tmp_path / "token_layout"
    source.write_text(TOKEN_PROGRAM % {"block": MX_SCALE_BLOCK})
    subprocess.run([NVCC, "-std=c++17", "-I", str(include), "-o", str(binary), str(source)], check=True)
    m, whole = 300, 1152  # K' padded in rows; 9 token tiles
    blocks = whole // MX_SCALE_BLOCK
    codes = (np.arange(m * blocks) % 250).reshape(m, blocks).astype(np.uint8)
    laid = np.asarray(mx_scales.to_kernel_layout(jnp.asarray(codes).view(jnp.float8_e8m0fnu), whole).view(jnp.uint8))
    for start, tokens in ((0, 128), (128, 384), (512, 640)):  # groups on token tiles, the last one to the end
        lines = subprocess.run(
            [str(binary), str(m), str(whole), str(start), str(tokens)], check=True, capture_output=True, text=True
        )
        table = np.array([list(map(int, line.split())) for line in lines.stdout.splitlines()])
        assert len(table) == m * tokens // MX_SCALE_BLOCK
        np.testing.assert_array_equal(laid[table[:, 2]], codes[table[:, 0], start // MX_SCALE_BLOCK + table[:, 1]])
