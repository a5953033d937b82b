// sm90a ragged_m for decode on block-scaled fp8 operands (DeepSeek-V3's
// recipe: A in 1x128 tiles along K, each group's B in 128x128 blocks, float32
// scales). A served MoE keeps its experts in fp8, and at decode the call is
// the stream of the non-empty groups' weights: one byte a value instead of
// two. The CUDA cores do the products, as in sm90_ragged_decode.cuh, whose
// group scan, zeroing of uncovered rows, work items and cluster reduction
// this kernel shares; what differs is how a CTA streams its K slice:
//
// - B is K-major ([G, N, K], as the fp8 tensor cores read it), so eight
//   lanes read one column's 128-value scale block in one coalesced 128-byte
//   stretch, 16 values each, and a warp covers four columns a step. Each
//   warp owns its columns: no sums meet across warps, only across the
//   cluster's CTAs (which split K in whole scale blocks).
// - A's rows of the item are staged in shared memory as float32, already
//   multiplied by their tile scales, one chunk of Stages blocks at a time
//   (the chunk's weight loads are issued first, so they fly during the
//   staging); B's block scale multiplies each 16-value partial sum.
//
// Contract: A [rows, K] and D [rows, N] row-major, B [G, N, K]; scale_a
// [rows, K/128], scale_b [G, K/128, ceil(N/128)]; K a multiple of 128, N of
// 8; at most kDecodeMaxGroups groups; rows past the groups are zero.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "kernels/sm90/sm90_ragged_decode.cuh"

namespace jax_cluster::sm90 {

namespace decode_blockwise {

constexpr int kWarps = kDecodeBlockwiseWarps;
constexpr int kThreads = kWarps * 32;
constexpr int kBlock = 128;                               // a scale block along K
constexpr int kValuesPerLane = 16;                        // one 16-byte load of fp8
constexpr int kLanesPerColumn = kBlock / kValuesPerLane;  // 8
constexpr int kColumnsPerStep = 32 / kLanesPerColumn;     // 4 per warp
// x keeps 4 floats of padding after every 16 values of K, so the eight lanes
// of a column (16 values apart) read eight different banks
constexpr int kPadEvery = 16, kPad = 4;

struct Args {
  decode::Args base;  // k_per_cta a multiple of kBlock
  const float* scale_a;
  const float* scale_b;
  int k_blocks, n_blocks;
};

// 16 e4m3 values to float32 (cvt.rn.f16x2.e4m3x2, then to float: exact).
__device__ inline void widen_e4m3(uint4 v, float (&out)[kValuesPerLane]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>(w[i] >> (16 * h)), __NV_E4M3);
      const float2 f = __half22float2(__half2(raw));
      out[4 * i + 2 * h] = f.x;
      out[4 * i + 2 * h + 1] = f.y;
    }
  }
}

template <int TileM>
__device__ inline int x_at(int kk, int r) {
  return kk * TileM + r + (kk / kPadEvery) * kPad;
}

template <int TileM, int Stages>
constexpr int kStagedFloats = Stages * kBlock * TileM + Stages * kBlock / kPadEvery * kPad;

// This CTA's partial of one item: Rows rows (the rows past `count` are zero)
// by TileN columns over its K slice [k0, k1), written to `partial`
// ([row][column]) by the warp that owns each column.
template <int TileM, int TileN, int Stages, int Rows>
__device__ void stream_item(const Args& args, int group, int row0, int count, int tile, int k0,
                            int k1, float* x, float* partial) {
  constexpr int Q = TileN / (kWarps * kColumnsPerStep);  // columns a lane owns
  const decode::Args& p = args.base;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int sub = lane % kLanesPerColumn;  // which 16 values of a block
  const uint8_t* a = static_cast<const uint8_t*>(p.a);
  const uint4* b_vectors = static_cast<const uint4*>(p.b);
  const int64_t vectors_per_column = p.k / kValuesPerLane;
  int col[Q];
  bool live[Q];
  const uint4* w_at[Q];
  const float* sb_at[Q];
#pragma unroll
  for (int q = 0; q < Q; ++q) {
    col[q] = tile * TileN + (warp * Q + q) * kColumnsPerStep + lane / kLanesPerColumn;
    live[q] = col[q] < p.n;
    const int c =
        live[q] ? col[q] : p.n - 1;  // dead lanes read nothing but keep their addresses valid
    w_at[q] = b_vectors + (int64_t(group) * p.n + c) * vectors_per_column + sub;
    sb_at[q] = args.scale_b + int64_t(group) * args.k_blocks * args.n_blocks + c / kBlock;
  }
  float acc[Q][Rows] = {};
  const int first = k0 / kBlock, last = k1 / kBlock;
  for (int chunk = first; chunk < last; chunk += Stages) {
    const int blocks = min(Stages, last - chunk);
    uint4 w[Stages][Q];
    float sb[Stages][Q];
#pragma unroll
    for (int s = 0; s < Stages; ++s)
#pragma unroll
      for (int q = 0; q < Q; ++q) {
        const bool load = live[q] && s < blocks;
        w[s][q] = load ? __ldg(w_at[q] + (chunk + s) * kLanesPerColumn) : make_uint4(0, 0, 0, 0);
        sb[s][q] = load ? __ldg(sb_at[q] + int64_t(chunk + s) * args.n_blocks) : 0.0f;
      }
    __syncthreads();  // the previous chunk's x is consumed
    const int vectors = blocks * kBlock / kValuesPerLane;
    for (int i = threadIdx.x; i < Rows * vectors; i += kThreads) {
      const int r = i / vectors, v = i % vectors;
      float values[kValuesPerLane] = {};
      if (r < count) {
        const int64_t row = row0 + r;
        const uint4 raw =
            __ldg(reinterpret_cast<const uint4*>(a + row * p.k + int64_t(chunk) * kBlock) + v);
        const float scale = __ldg(args.scale_a + row * args.k_blocks + chunk + v / kLanesPerColumn);
        widen_e4m3(raw, values);
#pragma unroll
        for (int j = 0; j < kValuesPerLane; ++j) values[j] *= scale;
      }
#pragma unroll
      for (int j = 0; j < kValuesPerLane; ++j)
        x[x_at<TileM>(v * kValuesPerLane + j, r)] = values[j];
    }
    __syncthreads();
#pragma unroll
    for (int s = 0; s < Stages; ++s) {
      if (s >= blocks) break;
      float wf[Q][kValuesPerLane];
#pragma unroll
      for (int q = 0; q < Q; ++q) widen_e4m3(w[s][q], wf[q]);
      float dot[Q][Rows] = {};
      const int kk0 = s * kBlock + sub * kValuesPerLane;
#pragma unroll
      for (int j = 0; j < kValuesPerLane; ++j) {
        float xr[Rows];
        const float* at = x + x_at<TileM>(kk0 + j, 0);
        if constexpr (Rows >= 4) {
#pragma unroll
          for (int r4 = 0; r4 < Rows; r4 += 4) {
            const float4 v = *reinterpret_cast<const float4*>(at + r4);
            xr[r4] = v.x, xr[r4 + 1] = v.y, xr[r4 + 2] = v.z, xr[r4 + 3] = v.w;
          }
        } else {
#pragma unroll
          for (int r = 0; r < Rows; ++r) xr[r] = at[r];
        }
#pragma unroll
        for (int q = 0; q < Q; ++q)
#pragma unroll
          for (int r = 0; r < Rows; ++r) dot[q][r] = fmaf(xr[r], wf[q][j], dot[q][r]);
      }
#pragma unroll
      for (int q = 0; q < Q; ++q)
#pragma unroll
        for (int r = 0; r < Rows; ++r) acc[q][r] = fmaf(dot[q][r], sb[s][q], acc[q][r]);
    }
  }
  // a column's eight lanes add up their sums; the first writes them
#pragma unroll
  for (int q = 0; q < Q; ++q)
#pragma unroll
    for (int r = 0; r < Rows; ++r) {
      float v = acc[q][r];
#pragma unroll
      for (int offset = 1; offset < kLanesPerColumn; offset *= 2)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
      if (sub == 0)
        partial[r * TileN + (warp * Q + q) * kColumnsPerStep + lane / kLanesPerColumn] = v;
    }
}

template <class Row, class D, int TileM, int TileN, int Stages, int Splits>
__global__ void __launch_bounds__(kThreads, 2) ragged_decode_blockwise_kernel(Args args) {
  static_assert(TileN % (kWarps * kColumnsPerStep) == 0, "whole columns for every lane");
  static_assert(TileM == 4 || TileM == 8, "rows per item, read four at a time");
  namespace cg = cooperative_groups;
  __shared__ decode::GroupTable table;
  __shared__ __align__(16) float x[kStagedFloats<TileM, Stages>];
  __shared__ float partials[2][TileM * TileN];  // alternate by item (see below)
  const decode::Args& p = args.base;

  decode::scan_groups<kThreads, TileM>(p, table);
  decode::zero_uncovered<D>(p, table.covered);

  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int clusters = gridDim.x / Splits, cluster_id = blockIdx.x / Splits;
  const int k0 = min(p.k, rank * p.k_per_cta), k1 = min(p.k, k0 + p.k_per_cta);
  const int64_t items = int64_t(table.chunks) * p.tiles_n;
  D* d = static_cast<D*>(p.d);
  int parity = 0;
  // one cluster barrier per item: an item's partials are read from one buffer
  // while the next item's are written to the other
  for (int64_t item = cluster_id; item < items; item += clusters, parity ^= 1) {
    const int chunk = static_cast<int>(item / p.tiles_n), tile = static_cast<int>(item % p.tiles_n);
    const int g = decode::owner(table, p.groups, chunk);
    const int row0 = table.start[g] + (chunk - table.first_chunk[g]) * TileM;
    const int count = min(TileM, table.start[g] + table.rows[g] - row0);
    float* partial = partials[parity];
    if (count <= 1)
      stream_item<TileM, TileN, Stages, 1>(args, g, row0, count, tile, k0, k1, x, partial);
    else if (count <= 2)
      stream_item<TileM, TileN, Stages, 2>(args, g, row0, count, tile, k0, k1, x, partial);
    else if (count <= 4 || TileM == 4)
      stream_item<TileM, TileN, Stages, 4>(args, g, row0, count, tile, k0, k1, x, partial);
    else stream_item<TileM, TileN, Stages, TileM>(args, g, row0, count, tile, k0, k1, x, partial);
    cluster.sync();  // every CTA's partial of this item is complete and visible
    for (int slot = rank + Splits * threadIdx.x; slot < count * TileN; slot += Splits * kThreads) {
      const int r = slot / TileN, col = tile * TileN + slot % TileN;
      if (col >= p.n) continue;
      float sum = 0.0f;
      for (int q = 0; q < Splits; ++q) sum += cluster.map_shared_rank(partial, q)[slot];
      d[int64_t(row0 + r) * p.n + col] = static_cast<D>(sum);
    }
  }
  cluster.sync();  // no CTA leaves while another may still read its partials
}

}  // namespace decode_blockwise

// The block-scaled menu rows of the decode kind: TileM rows per item, TileN
// columns (eight warps, four columns each a step, TileN / 32 columns a lane),
// TileK = one scale block, Stages scale blocks of every column in flight per
// lane, a cluster of ClusterM CTAs splitting K.
template <class Row, class ElementD, int TileM, int TileN, int TileK, int ClusterM, int ClusterN,
          int Stages>
struct RaggedDecode<Row, cutlass::float_e4m3_t, ElementD, cutlass::layout::RowMajor,
                    cutlass::layout::ColumnMajor, TileM, TileN, TileK, ClusterM, ClusterN, Stages,
                    RaggedProblem::kRaggedM> {
  static_assert(TileK == decode_blockwise::kBlock, "a K step is one scale block");
  static_assert(ClusterN == 1 && ClusterM <= 8, "a portable cluster of CTAs along K");
  static constexpr int kThreads = decode_blockwise::kThreads;
  static constexpr auto kernel =
      &decode_blockwise::ragged_decode_blockwise_kernel<Row, ElementD, TileM, TileN, Stages,
                                                        ClusterM>;

  static const char* run(const GemmProblem& p, const LaunchChoices& c, const DeviceSlots& s, void*,
                         size_t, cudaStream_t stream) {
    if (const char* why = decode::refused(p, c, s)) return why;
    if (p.scale_a == nullptr || p.scale_b == nullptr) return "a block-scaled variant needs scales";
    if (p.k % decode_blockwise::kBlock || p.n % decode::kColumnsPerLane)
      return "a block-scaled decode variant needs K a multiple of 128 and N of 8";
    const int k_blocks = p.k / decode_blockwise::kBlock;
    decode_blockwise::Args args{
        {p.a, p.b, p.d, p.group_sizes, p.batch, p.m, p.n, p.k, (p.n + TileN - 1) / TileN,
         (k_blocks + ClusterM - 1) / ClusterM * decode_blockwise::kBlock},
        p.scale_a,
        p.scale_b,
        k_blocks,
        (p.n + decode_blockwise::kBlock - 1) / decode_blockwise::kBlock};
    return decode::launch_items(kernel, p, TileM, args.base.tiles_n, ClusterM, kThreads, 0,
                                s.max_active_clusters, stream, args);
  }

  static int max_active_clusters(int device_id) {
    return decode::resident_clusters(kernel, device_id, ClusterM, kThreads, 0,
                                     [] { return cudaSuccess; });
  }

  static constexpr VariantOps ops{&decode::no_workspace, &run, &max_active_clusters};
};

}  // namespace jax_cluster::sm90
