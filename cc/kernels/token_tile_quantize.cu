// The token-tile quantization of token_tile_quantize.h: one block per
// 128-row tile and 512 columns. Each block finds the group that owns its
// tile (tiles never straddle groups in the block-aligned layout) with the
// same scans as the grouped GEMMs' prepare kernel, then, 64 columns at a
// time, stages the tile's rows in shared memory, reduces each column's
// amax and writes the column's 128 fp8 values contiguously (the transpose)
// and its scale. One read of x and one byte written per value.
#include <cstdint>

#include <cub/block/block_scan.cuh>

#include "common/contract.h"  // kScaleBlock
#include "kernels/fp8_quantize.cuh"
#include "kernels/token_tile_quantize.h"

namespace jax_cluster {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = kScaleBlock;                 // rows of a tile
constexpr int kColumns = kTokenTileColumns;        // columns staged at once
constexpr int kQuarters = kThreads / kColumns;     // each thread: one column, a quarter of the rows
constexpr int kRowsPerThread = kTile / kQuarters;  // 32: two 16-byte stores of fp8
constexpr int kColumnsPerBlock = 8 * kColumns;
static_assert(kRowsPerThread == 32, "a thread writes its column's rows as two 16-byte stores");

// The rows of x a tile holds: from `source` on, `count` of them (0: a tile of zeros).
struct TileRows {
  int64_t source;
  int count;
};

// Every block scans the clamped sizes (a negative size counts as 0, groups
// are cut at m) and their spans rounded up to whole tiles (cut at `rows`);
// the one group whose span holds `first_row` owns the tile.
__device__ TileRows tile_rows(const int32_t* group_sizes, int groups, int64_t m, int64_t rows,
                              int64_t first_row) {
  using Scan = cub::BlockScan<int64_t, kThreads>;
  __shared__ typename Scan::TempStorage temp, aligned_temp;
  __shared__ int64_t carry, aligned_carry;
  __shared__ TileRows found;
  if (threadIdx.x == 0) carry = 0, aligned_carry = 0, found = {0, 0};
  __syncthreads();
  for (int base = 0; base < groups; base += kThreads) {
    int g = base + threadIdx.x;
    int64_t size = g < groups ? max(group_sizes[g], 0) : 0;
    int64_t offset, total, aligned_offset, aligned_total;
    Scan(temp).ExclusiveSum(size, offset, total);
    int64_t start = min(carry + offset, m), kept = min(carry + offset + size, m) - start;
    int64_t span = (kept + kTile - 1) / kTile * kTile;
    Scan(aligned_temp).ExclusiveSum(span, aligned_offset, aligned_total);
    int64_t aligned_start = min(aligned_carry + aligned_offset, rows);
    if (g < groups && kept > 0 && aligned_start <= first_row && first_row < aligned_start + span) {
      int64_t local = first_row - aligned_start;
      found = {start + local, static_cast<int>(min(kept - local, int64_t(kTile)))};
    }
    __syncthreads();
    if (threadIdx.x == 0) carry += total, aligned_carry += aligned_total;
    __syncthreads();
  }
  return found;
}

template <class In, class Out>
__global__ void __launch_bounds__(kThreads)
    quantize_token_tiles_kernel(const In* x, int64_t m, int64_t columns, const int32_t* group_sizes,
                                int groups, int64_t rows, uint8_t* values, float* scales) {
  constexpr int kVec = 16 / sizeof(In);  // elements of one 16-byte load
  constexpr int kVecsPerRow = kColumns / kVec;
  constexpr int kLoads = kTile * kVecsPerRow / kThreads;
  // x's own type: a warp's 16-byte stores are contiguous, a column read is a broadcast-free row
  __shared__ __align__(16) In tile[kTile][kColumns];
  __shared__ float partial[kQuarters][kColumns];
  const int64_t first_row = int64_t(blockIdx.x) * kTile;
  const TileRows own = tile_rows(group_sizes, groups, m, rows, first_row);
  const int quarter = threadIdx.x / kColumns, c = threadIdx.x % kColumns;
  const int64_t column_end = min(columns, (blockIdx.y + 1) * int64_t(kColumnsPerBlock));
  for (int64_t c0 = blockIdx.y * int64_t(kColumnsPerBlock); c0 < column_end; c0 += kColumns) {
    uint4 staged[kLoads];
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {  // all loads in flight before the stores
      int v = threadIdx.x + i * kThreads, r = v / kVecsPerRow, j = v % kVecsPerRow;
      staged[i] =
          r < own.count
              ? *reinterpret_cast<const uint4*>(x + (own.source + r) * columns + c0 + j * kVec)
              : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      int v = threadIdx.x + i * kThreads, r = v / kVecsPerRow, j = v % kVecsPerRow;
      *reinterpret_cast<uint4*>(&tile[r][j * kVec]) = staged[i];
    }
    __syncthreads();
    float amax = 0.0f;
    for (int r = quarter * kRowsPerThread; r < (quarter + 1) * kRowsPerThread; ++r)
      amax = fp8::nan_max(amax, fabsf(fp8::to_float(tile[r][c])));
    partial[quarter][c] = amax;
    __syncthreads();
    for (int i = 0; i < kQuarters; ++i) amax = fp8::nan_max(amax, partial[i][c]);
    const float scale = fp8::scale_of<Out>(amax);
    if (quarter == 0) scales[int64_t(blockIdx.x) * columns + c0 + c] = scale;
    const float inverse = fp8::inverse_of(scale);
    fp8::store_column_rows<Out>(tile, quarter * kRowsPerThread, c, inverse,
                                values + (c0 + c) * rows + first_row + quarter * kRowsPerThread);
    __syncthreads();  // the tile is restaged for the next columns
  }
}

template <class In, class Out>
struct Launch {
  static const char* run(const TokenTileQuantize& q, cudaStream_t stream) {
    dim3 grid(static_cast<unsigned>(q.rows / kTile),
              static_cast<unsigned>((q.columns + kColumnsPerBlock - 1) / kColumnsPerBlock));
    quantize_token_tiles_kernel<In, Out><<<grid, kThreads, 0, stream>>>(
        static_cast<const In*>(q.x), q.m, q.columns, q.group_sizes, q.groups, q.rows,
        static_cast<uint8_t*>(q.values), q.scales);
    cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
  }
};

}  // namespace

const char* quantize_token_tiles(const TokenTileQuantize& q, cudaStream_t stream) {
  if (q.rows == 0 || q.columns == 0) return nullptr;
  if (q.rows % kTile || q.columns % kColumns)
    return "rows must be a multiple of 128 and columns of 64";
  if (q.rows / kTile > INT32_MAX || (q.columns + kColumnsPerBlock - 1) / kColumnsPerBlock > 65535)
    return "too many tiles for one launch";
  return fp8::launch_for_types<Launch>(q.input, q.output, q, stream);
}

}  // namespace jax_cluster
