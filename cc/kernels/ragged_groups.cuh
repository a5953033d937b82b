// Turns a device-resident group_sizes vector into the per-group arrays a
// CUTLASS grouped GEMM reads (problem shapes, operand pointers, strides), and
// writes the zeros that no GEMM tile covers. Everything runs on XLA's stream:
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

template <class Shape, class ElementA, class ElementB, class ElementD, class StrideA, class StrideB,
          class StrideD>
struct RaggedGroupArrays {
  Shape* shapes;
  const ElementA** a;
  const ElementB** b;
  ElementD** d;
  StrideA* stride_a;
  StrideB* stride_b;
  StrideD* stride_d;
  int64_t* covered_rows;  // rows inside some group: min(sum of sizes, M)
  // [groups + 1]: first cluster tile of each group; [groups] is the total.
  int32_t* tile_start = nullptr;

  using ShapeType = Shape;
  using ElementAType = ElementA;
  using ElementBType = ElementB;
  using ElementDType = ElementD;
  using StrideAType = StrideA;
  using StrideBType = StrideB;
  using StrideDType = StrideD;
};

inline constexpr int kRaggedPrepThreads = 256;

// One block: a running exclusive scan of the clamped sizes, chunk by chunk.
// `rows` is M of the ragged dimension; (m, n, k) is the GEMM view of the launch.
// Strides are the same for every group (each group is a slice of one packed
// buffer), so the host computes them once. With out.tile_start set, a cluster
// tile is cluster_tile_m rows by one of tiles_n column tiles.
template <RaggedProblem P, class Arrays, class StrideA, class StrideB, class StrideD>
__global__ void __launch_bounds__(kRaggedPrepThreads)
    build_ragged_groups(const int32_t* group_sizes, int groups, int64_t rows, int m, int n, int k,
                        const void* a, const void* b, void* d, Arrays out, StrideA stride_a,
                        StrideB stride_b, StrideD stride_d, int cluster_tile_m = 1,
                        int tiles_n = 0) {
  using Scan = cub::BlockScan<int64_t, kRaggedPrepThreads>;
  __shared__ typename Scan::TempStorage temp, tile_temp;
  __shared__ int64_t carry, tile_carry;
  if (threadIdx.x == 0) carry = 0, tile_carry = 0;
  __syncthreads();
  using EA = typename std::remove_cv_t<std::remove_pointer_t<decltype(out.a)>>;
  using EB = typename std::remove_cv_t<std::remove_pointer_t<decltype(out.b)>>;
  using ED = typename std::remove_pointer_t<decltype(out.d)>;
  for (int base = 0; base < groups; base += kRaggedPrepThreads) {
    int g = base + threadIdx.x;
    int64_t size = g < groups ? max(group_sizes[g], 0) : 0;
    int64_t offset, chunk_total;
    Scan(temp).ExclusiveSum(size, offset, chunk_total);
    int64_t start = min(carry + offset, rows), end = min(carry + offset + size, rows);
    int g_rows = static_cast<int>(end - start);
    if (g < groups) {
      if constexpr (P == RaggedProblem::kRaggedM) {
        out.shapes[g] = {g_rows, n, k};
        out.a[g] = static_cast<EA>(a) + start * k;
        out.b[g] = static_cast<EB>(b) + int64_t(g) * n * k;
        out.d[g] = static_cast<ED>(d) + start * n;
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
    }
    int64_t tile_offset = 0, tile_chunk_total = 0;
    if (out.tile_start != nullptr) {  // the same for every thread: the scan stays collective
      // ragged_m: each group's rows in cluster tiles; ragged_k: the whole K'
      // extent once per group with rows.
      int64_t row_tiles = P == RaggedProblem::kRaggedM
                              ? (g_rows + cluster_tile_m - 1) / cluster_tile_m
                              : (g_rows > 0 ? (m + cluster_tile_m - 1) / cluster_tile_m : 0);
      Scan(tile_temp).ExclusiveSum(g < groups ? row_tiles * tiles_n : 0, tile_offset,
                                   tile_chunk_total);
      if (g < groups) out.tile_start[g] = static_cast<int32_t>(tile_carry + tile_offset);
    }
    __syncthreads();
    if (threadIdx.x == 0) carry += chunk_total, tile_carry += tile_chunk_total;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    *out.covered_rows = min(carry, rows);
    if (out.tile_start != nullptr) out.tile_start[groups] = static_cast<int32_t>(tile_carry);
  }
}

// Zeros, 16 bytes at a time (the planner keeps rows 16-byte aligned):
// ragged_m: rows [covered, M) of D; ragged_k: D[g] of every group without rows.
template <RaggedProblem P, class Shape>
__global__ void zero_uncovered_output(const Shape* shapes, const int64_t* covered_rows, int groups,
                                      int64_t rows, int64_t row_bytes, int64_t group_bytes,
                                      void* d) {
  auto* out = static_cast<uint4*>(d);
  int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if constexpr (P == RaggedProblem::kRaggedM) {
    int64_t begin = *covered_rows * row_bytes / 16, end = rows * row_bytes / 16;
    for (int64_t i = begin + first; i < end; i += stride) out[i] = make_uint4(0, 0, 0, 0);
  } else {
    int64_t vecs = group_bytes / 16;
    for (int g = 0; g < groups; ++g) {
      if (cute::get<0>(shapes[g]) != 0) continue;
      for (int64_t i = first; i < vecs; i += stride) out[g * vecs + i] = make_uint4(0, 0, 0, 0);
    }
  }
}

}  // namespace jax_cluster
