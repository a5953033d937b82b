// Turns a device-resident group_sizes vector into the per-group arrays a
// CUTLASS grouped GEMM reads (problem shapes, operand pointers, strides), and
// writes the zeros that no GEMM tile covers, in one launch on XLA's stream:
// the host never sees the group sizes.
//
// The rule for bad sizes (the Python fallback applies the same one): a
// negative size counts as 0, and groups are cut at the row count M, so no
// group ever reaches past the buffers.
//
// For a scheduler that maps a linear cluster-tile id to its group (sm100's
// CLC), it also writes tile_start, the exclusive scan of each group's cluster
// tiles; callers that do not need it (sm90) leave tile_start null.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cub/block/block_scan.cuh>
#include <cuda_runtime_api.h>
#include <cute/tensor.hpp>

#include "common/gemm_problem.h"

namespace jax_cluster {

// ragged_m: D[rows of g] = A[rows of g] · B[g]; rows past the groups are zero.
// ragged_k: D[g] = A[rows of g]ᵀ · B[rows of g]; a group without rows is zero.
enum class RaggedProblem : int { kRaggedM = 0, kRaggedK = 1 };

// The scale arrays of a block-scaled grouped GEMM: each group's scale
// pointer, and (MX only) each group's scale-factor layout; void layouts
// where the mainloop derives them from the group's shape.
template <class Element = float, class LayoutSFA = void, class LayoutSFB = void>
struct GroupScaleTypes {
  using ElementType = Element;
  using LayoutSFAType = LayoutSFA;
  using LayoutSFBType = LayoutSFB;
};

template <class T>
inline constexpr size_t bytes_of = sizeof(T);
template <>
inline constexpr size_t bytes_of<void> = 0;

template <class Shape, class ElementA, class ElementB, class ElementD, class StrideA, class StrideB,
          class StrideD, class Scales = GroupScaleTypes<>>
struct RaggedGroupArrays {
  using ElementScale = typename Scales::ElementType;
  using LayoutSFA = typename Scales::LayoutSFAType;
  using LayoutSFB = typename Scales::LayoutSFBType;

  Shape* shapes;
  const ElementA** a;
  const ElementB** b;
  ElementD** d;
  StrideA* stride_a;
  StrideB* stride_b;
  StrideD* stride_d;
  // [groups + 1]: first cluster tile of each group; [groups] is the total.
  int32_t* tile_start = nullptr;
  // Block-scaled (fp8) only: each group's scale arrays (the Operands policy
  // of kernels/cutlass_grouped_gemm.cuh says where they lie), and for MX each
  // group's scale-factor layouts.
  const ElementScale** scale_a = nullptr;
  const ElementScale** scale_b = nullptr;
  LayoutSFA* layout_sfa = nullptr;
  LayoutSFB* layout_sfb = nullptr;

  using ShapeType = Shape;
  using ElementAType = ElementA;
  using ElementBType = ElementB;
  using ElementDType = ElementD;
  using StrideAType = StrideA;
  using StrideBType = StrideB;
  using StrideDType = StrideD;
};

// Where group g lies, as the prepare kernel hands it to an Operands policy:
// its first row (in the rows' own layout) and row count, and its first row
// in a layout where every group starts on a kScaleBlock boundary (the MX
// scale factors' row tiles; equal to start for block-aligned rows).
struct GroupSpan {
  int g;
  int64_t start, aligned_start;
  int rows;
};

inline constexpr int kRaggedPrepThreads = 256;

__host__ __device__ constexpr int64_t round_up_to_tile(int64_t rows) {
  return (rows + kScaleBlock - 1) / kScaleBlock * kScaleBlock;
}

// Every block runs the same exclusive scan of the clamped sizes, chunk by
// chunk (a few hundred integers: cheaper than a second launch, which cost
// 2.4 us of a decode call on the H200); block 0 writes the per-group arrays,
// and all blocks zero, 16 bytes at a time (the planner keeps rows 16-byte
// aligned), the output no tile covers: ragged_m, rows [covered, M) of D;
// ragged_k, D[g] of every group without rows.
// `rows` is M of the ragged dimension; (m, n, k) is the GEMM view of the
// launch; ragged_m's D has d_cols columns (n, or n / 2 under the gated
// epilogue, which writes one column per gate and up pair). Operands
// (kernels/cutlass_grouped_gemm.cuh) says how the operands' rows are laid out and writes each
// group's scale arrays: kBlockAlignedGroups (block-scaled ragged_k): A [m, rows] and B [n, rows]
// hold the rows contiguous, and group g starts at the sum of the earlier
// sizes each rounded up to kScaleBlock (so no scale tile straddles groups),
// cut at `rows` like the sizes themselves. Strides are the same for every
// group (each group is a slice of one packed buffer), so the host computes
// them once. With out.tile_start set, a cluster tile is cluster_tile_m rows
// by one of tiles_n column tiles.
template <RaggedProblem P, class Operands, class Arrays, class StrideA, class StrideB,
          class StrideD>
__global__ void __launch_bounds__(kRaggedPrepThreads)
    prepare_ragged_groups(const int32_t* group_sizes, int groups, int64_t rows, int m, int n, int k,
                          int d_cols, const void* a, const void* b, void* d, Arrays out,
                          StrideA stride_a, StrideB stride_b, StrideD stride_d, int cluster_tile_m,
                          int tiles_n, int64_t row_bytes, const void* scale_a,
                          const void* scale_b) {
  constexpr bool kBlockAligned = Operands::kBlockAlignedGroups;
  using Scan = cub::BlockScan<int64_t, kRaggedPrepThreads>;
  __shared__ typename Scan::TempStorage temp, tile_temp, aligned_temp;
  __shared__ int64_t carry, tile_carry, aligned_carry;
  __shared__ bool empty[kRaggedPrepThreads];
  if (threadIdx.x == 0) carry = 0, tile_carry = 0, aligned_carry = 0;
  __syncthreads();
  using EA = typename std::remove_cv_t<std::remove_pointer_t<decltype(out.a)>>;
  using EB = typename std::remove_cv_t<std::remove_pointer_t<decltype(out.b)>>;
  using ED = typename std::remove_pointer_t<decltype(out.d)>;
  const bool writer = blockIdx.x == 0;  // the same for the whole block: scans stay collective
  auto* zeros = static_cast<uint4*>(d);
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int base = 0; base < groups; base += kRaggedPrepThreads) {
    int g = base + threadIdx.x;
    int64_t size = g < groups ? max(group_sizes[g], 0) : 0;
    // the rows a group takes: its size, or its size in whole scale tiles
    int64_t span = kBlockAligned ? round_up_to_tile(size) : size;
    int64_t offset, chunk_total;
    Scan(temp).ExclusiveSum(span, offset, chunk_total);
    int64_t start = min(carry + offset, rows), end = min(carry + offset + size, rows);
    int g_rows = static_cast<int>(end - start);
    // each group's rows rounded up to whole tiles: where its scale tiles start
    int64_t aligned_offset = 0, aligned_total = 0;
    if constexpr (Operands::kAlignedScaleRows)
      Scan(aligned_temp).ExclusiveSum(round_up_to_tile(g_rows), aligned_offset, aligned_total);
    if (writer && g < groups) {
      if constexpr (P == RaggedProblem::kRaggedM) {
        out.shapes[g] = {g_rows, n, k};
        out.a[g] = static_cast<EA>(a) + start * k;
        out.b[g] = static_cast<EB>(b) + int64_t(g) * n * k;
        out.d[g] = static_cast<ED>(d) + start * d_cols;
      } else if constexpr (kBlockAligned) {
        // A [m, rows] and B [n, rows]: a group is a column slice; an empty one gets no tiles.
        out.shapes[g] = {g_rows > 0 ? m : 0, n, g_rows};
        out.a[g] = static_cast<EA>(a) + start;
        out.b[g] = static_cast<EB>(b) + start;
        out.d[g] = static_cast<ED>(d) + int64_t(g) * m * n;
      } else {
        // A is the [rows, m] buffer read transposed; an empty group gets no tiles.
        out.shapes[g] = {g_rows > 0 ? m : 0, n, g_rows};
        out.a[g] = static_cast<EA>(a) + start * m;
        out.b[g] = static_cast<EB>(b) + start * n;
        out.d[g] = static_cast<ED>(d) + int64_t(g) * m * n;
      }
      out.stride_a[g] = stride_a;
      out.stride_b[g] = stride_b;
      out.stride_d[g] = stride_d;
      const int64_t aligned_start = kBlockAligned ? start : aligned_carry + aligned_offset;
      Operands::template set_group_scales<P>(out, GroupSpan{g, start, aligned_start, g_rows}, m, n,
                                             k, scale_a, scale_b);
    }
    int64_t tile_chunk_total = 0;
    if (writer && out.tile_start != nullptr) {
      // ragged_m: each group's rows in cluster tiles; ragged_k: the whole K'
      // extent once per group with rows.
      int64_t row_tiles = P == RaggedProblem::kRaggedM
                              ? (g_rows + cluster_tile_m - 1) / cluster_tile_m
                              : (g_rows > 0 ? (m + cluster_tile_m - 1) / cluster_tile_m : 0);
      int64_t tile_offset = 0;
      Scan(tile_temp).ExclusiveSum(g < groups ? row_tiles * tiles_n : 0, tile_offset,
                                   tile_chunk_total);
      if (g < groups) out.tile_start[g] = static_cast<int32_t>(tile_carry + tile_offset);
    }
    if constexpr (P == RaggedProblem::kRaggedK) {
      empty[threadIdx.x] = g < groups && g_rows == 0;
      __syncthreads();
      const int64_t vecs = int64_t(m) * row_bytes / 16;  // D[g] is [m, n]
      for (int j = 0; j < kRaggedPrepThreads && base + j < groups; ++j) {
        if (!empty[j]) continue;
        for (int64_t i = first; i < vecs; i += step)
          zeros[(base + j) * vecs + i] = make_uint4(0, 0, 0, 0);
      }
    }
    __syncthreads();
    if (threadIdx.x == 0)
      carry += chunk_total, tile_carry += tile_chunk_total, aligned_carry += aligned_total;
    __syncthreads();
  }
  if (writer && threadIdx.x == 0 && out.tile_start != nullptr)
    out.tile_start[groups] = static_cast<int32_t>(tile_carry);
  if constexpr (P == RaggedProblem::kRaggedM) {
    const int64_t covered = min(carry, rows);  // rows inside some group
    const int64_t end = rows * row_bytes / 16;
    for (int64_t i = covered * row_bytes / 16 + first; i < end; i += step)
      zeros[i] = make_uint4(0, 0, 0, 0);
  }
}

}  // namespace jax_cluster
