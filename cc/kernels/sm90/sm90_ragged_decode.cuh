// sm90a ragged_m for decode: a few rows per group, so the call is the
// stream of the non-empty groups' weights, and tensor cores would idle on
// padded tiles. No CUTLASS, no per-group TMA descriptors, one launch:
//
// - Every CTA scans group_sizes itself (a few hundred integers) into each
//   group's first row, row count and first work item, and zeroes its share
//   of the rows past the groups.
// - A work item is up to TileM rows of one group times TileN columns. A
//   cluster of S CTAs (the plan's `splits`) takes items round-robin
//   (static: items cost the same), its CTAs splitting K; each lane of a
//   CTA's TileK warps reads 8 columns of a row of B in one 16-byte load,
//   Stages loads in flight per lane.
// - An item of up to kDecodeRegisterRows rows reads A in registers: each warp
//   takes Stages consecutive rows of B per step and each row's Stages values
//   of A in one load beside them, with no block barrier. A larger item stages
//   its A values in shared memory a chunk at a time, each warp then taking
//   every TileK-th row of B.
// - The warps' partial sums meet in shared memory, the CTAs' through
//   distributed shared memory: each CTA sums a slice of the tile over the
//   cluster and writes it. Two buffers alternate, so one cluster barrier per
//   item orders the reads of one item before the writes of the item after.
//
// Contract (ragged_groups.cuh's rule for bad sizes: a negative size counts
// as 0, groups are cut at the row count): A [rows, K] and D [rows, N]
// row-major, B [G, K, N]; rows past the groups are zero. N and K multiples
// of 8 (16-byte rows); at most kDecodeMaxGroups groups.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <set>
#include <type_traits>

#include <cub/block/block_scan.cuh>
#include <cutlass/layout/matrix.h>
#include <cutlass/numeric_types.h>

#include "common/contract.h"
#include "common/gemm_problem.h"
#include "kernels/launch_recording.h"
#include "kernels/ragged_groups.cuh"

namespace jax_cluster::sm90 {

namespace decode {

constexpr int kColumnsPerLane = 8;  // one 16-byte load of bf16/f16
constexpr int kChunk = 256;         // rows of K whose A values are staged at once

struct Args {
  const void* a;
  const void* b;
  void* d;
  const int32_t* group_sizes;
  int groups, rows, n, k, tiles_n, k_per_cta;
};

__device__ inline void widen(uint4 v, float (&out)[8], cutlass::bfloat16_t) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(w[i] << 16);
    out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

__device__ inline void widen(uint4 v, float (&out)[8], cutlass::half_t) {
  const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 f = __half22float2(h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

template <class T>
__device__ inline float to_float(T v) {
  return static_cast<float>(v);
}

// What every CTA knows about the groups after its scan.
struct GroupTable {
  int32_t start[kDecodeMaxGroups];        // first row
  int32_t rows[kDecodeMaxGroups];         // row count after clamping
  int32_t first_chunk[kDecodeMaxGroups];  // first row chunk (TileM rows) of the group
  int32_t chunks, covered;                // all chunks; rows inside some group
};

// The group owning `chunk`: the last one whose first chunk is at most it (an
// empty group shares its first chunk with the next group, which wins).
__device__ inline int owner(const GroupTable& t, int groups, int chunk) {
  int lo = 0, hi = groups - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (t.first_chunk[mid] <= chunk) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

template <int Threads, int TileM>
__device__ void scan_groups(const Args& p, GroupTable& t) {
  using Scan = cub::BlockScan<int64_t, Threads>;  // int32 sizes may sum past 2^31
  __shared__ typename Scan::TempStorage temp;
  __shared__ int64_t carry_rows, carry_chunks;
  if (threadIdx.x == 0) carry_rows = 0, carry_chunks = 0;
  __syncthreads();
  for (int base = 0; base < p.groups; base += Threads) {
    const int g = base + threadIdx.x;
    const int64_t size = g < p.groups ? max(p.group_sizes[g], 0) : 0;
    int64_t offset, total;
    Scan(temp).ExclusiveSum(size, offset, total);
    const int64_t start = min(carry_rows + offset, int64_t(p.rows));
    const int rows = static_cast<int>(min(carry_rows + offset + size, int64_t(p.rows)) - start);
    const int64_t chunks = (rows + TileM - 1) / TileM;
    __syncthreads();  // temp is reused
    int64_t chunk_offset, chunk_total;
    Scan(temp).ExclusiveSum(chunks, chunk_offset, chunk_total);
    if (g < p.groups) {
      t.start[g] = static_cast<int32_t>(start);
      t.rows[g] = rows;
      t.first_chunk[g] = static_cast<int32_t>(carry_chunks + chunk_offset);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      carry_rows += total;
      carry_chunks += chunk_total;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    t.chunks = static_cast<int32_t>(carry_chunks);
    t.covered = static_cast<int32_t>(min(carry_rows, int64_t(p.rows)));
  }
  __syncthreads();
}

// Rows [covered, rows) of D belong to no group: zero them, 16 bytes at a time.
template <class D>
__device__ void zero_uncovered(const Args& p, int covered) {
  constexpr int kPerVector = 16 / sizeof(D);
  auto* out = static_cast<uint4*>(p.d);
  const int64_t begin = int64_t(covered) * p.n / kPerVector,
                end = int64_t(p.rows) * p.n / kPerVector;
  for (int64_t i = begin + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < end;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = make_uint4(0, 0, 0, 0);
}

// Each warp's sums of one item (Rows rows of its 8 columns per lane) are
// added up over the warps into `partial` (laid out [row][column % 8][lane],
// conflict-free) through `stage` (one TileM x TileN tile per warp): each
// thread adds a few of the tile's sums (shared-memory float atomics are
// compare-and-swap loops on sm90).
template <int TileM, int TileN, int Warps, int Rows>
__device__ void sum_over_warps(const float (&acc)[Rows][kColumnsPerLane], float* stage,
                               float* partial) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* mine = stage + warp * TileM * TileN;
#pragma unroll
  for (int r = 0; r < Rows; ++r)
#pragma unroll
    for (int j = 0; j < kColumnsPerLane; ++j)
      mine[(r * kColumnsPerLane + j) * 32 + lane] = acc[r][j];
  __syncthreads();
  for (int e = threadIdx.x; e < Rows * TileN; e += blockDim.x) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < Warps; ++w) sum += stage[w * TileM * TileN + e];
    partial[e] = sum;
  }
}

// This CTA's partial of an item of Rows rows (TileM at most; the rows past
// `count` are zero in x) by TileN columns over its K slice [k0, k1), A's
// values staged in shared memory a chunk at a time: each warp takes every
// Warps-th row of B.
template <class T, int TileM, int TileN, int Warps, int Stages, int Rows>
__device__ void stage_and_stream(const Args& p, int group, int row0, int count, int tile, int k0,
                                 int k1, float (*x)[TileM], float* stage, float* partial) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int col = tile * TileN + lane * kColumnsPerLane;
  const bool live = col < p.n;
  const T* a = static_cast<const T*>(p.a);
  const uint4* b =
      reinterpret_cast<const uint4*>(static_cast<const T*>(p.b) + int64_t(group) * p.k * p.n + col);
  const int64_t b_row = p.n / kColumnsPerLane;  // uint4s per row of B
  float acc[Rows][kColumnsPerLane] = {};
  for (int kc = k0; kc < k1; kc += kChunk) {
    const int kn = min(kChunk, k1 - kc);
    __syncthreads();  // the previous chunk's x is consumed
    for (int i = threadIdx.x; i < Rows * kn; i += blockDim.x) {
      const int r = i / kn, kk = i % kn;
      x[kk][r] = r < count ? to_float(a[int64_t(row0 + r) * p.k + kc + kk]) : 0.0f;
    }
    __syncthreads();
    for (int kk = warp; kk < kn; kk += Warps * Stages) {
      uint4 w[Stages];
#pragma unroll
      for (int s = 0; s < Stages; ++s) {
        const int kr = kk + s * Warps;
        w[s] = live && kr < kn ? __ldg(b + int64_t(kc + kr) * b_row) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int s = 0; s < Stages; ++s) {
        const int kr = kk + s * Warps;
        if (kr >= kn) break;
        float wf[kColumnsPerLane];
        widen(w[s], wf, T{});
#pragma unroll
        for (int r = 0; r < Rows; ++r) {
          const float xv = x[kr][r];
#pragma unroll
          for (int j = 0; j < kColumnsPerLane; ++j) acc[r][j] = fmaf(xv, wf[j], acc[r][j]);
        }
      }
    }
  }
  sum_over_warps<TileM, TileN, Warps, Rows>(acc, stage, partial);
}

// The same partial for an item of at most kDecodeRegisterRows rows, A read into
// registers: each warp takes Stages consecutive rows of B per step and,
// beside their Stages loads, each of the item's rows' Stages values of A in
// one 16-byte load (every lane the same address: one transaction). No block
// barrier until the warps' sums meet. [k0, k1) is a whole number of steps.
template <class T, int TileM, int TileN, int Warps, int Stages, int Rows>
__device__ void stream_in_registers(const Args& p, int group, int row0, int count, int tile, int k0,
                                    int k1, float* stage, float* partial) {
  // every decode row's stages fit this (a menu row that does not fails here)
  static_assert(Stages * sizeof(T) == 16, "a step's values of one row of A fill one 16-byte load");
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int col = tile * TileN + lane * kColumnsPerLane;
  const bool live = col < p.n;
  const T* a = static_cast<const T*>(p.a) + int64_t(row0) * p.k;
  const uint4* b =
      reinterpret_cast<const uint4*>(static_cast<const T*>(p.b) + int64_t(group) * p.k * p.n + col);
  const int64_t b_row = p.n / kColumnsPerLane;  // uint4s per row of B
  float acc[Rows][kColumnsPerLane] = {};
  for (int kk = k0 + warp * Stages; kk < k1; kk += Warps * Stages) {
    uint4 w[Stages], av[Rows];
#pragma unroll
    for (int s = 0; s < Stages; ++s)
      w[s] = live ? __ldg(b + int64_t(kk + s) * b_row) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int r = 0; r < Rows; ++r)
      av[r] = r < count ? __ldg(reinterpret_cast<const uint4*>(a + int64_t(r) * p.k + kk))
                        : make_uint4(0, 0, 0, 0);
    float af[Rows][Stages];
#pragma unroll
    for (int r = 0; r < Rows; ++r) widen(av[r], af[r], T{});
#pragma unroll
    for (int s = 0; s < Stages; ++s) {
      float wf[kColumnsPerLane];
      widen(w[s], wf, T{});
#pragma unroll
      for (int r = 0; r < Rows; ++r)
#pragma unroll
        for (int j = 0; j < kColumnsPerLane; ++j) acc[r][j] = fmaf(af[r][s], wf[j], acc[r][j]);
    }
  }
  sum_over_warps<TileM, TileN, Warps, Rows>(acc, stage, partial);
}

template <class T, int TileM, int TileN, int Warps, int Stages, int Rows>
__device__ void stream_item(const Args& p, int group, int row0, int count, int tile, int k0, int k1,
                            float (*x)[TileM], float* stage, float* partial) {
  // larger items stage A, where one load of it serves more rows of B
  if constexpr (Rows <= kDecodeRegisterRows)
    stream_in_registers<T, TileM, TileN, Warps, Stages, Rows>(p, group, row0, count, tile, k0, k1,
                                                              stage, partial);
  else
    stage_and_stream<T, TileM, TileN, Warps, Stages, Rows>(p, group, row0, count, tile, k0, k1, x,
                                                           stage, partial);
}

// Row: the menu row's tag type, which names the kernel's symbol after its row.
template <class Row, class T, class D, int TileM, int TileN, int Warps, int Stages, int Splits>
__global__ void __launch_bounds__(Warps * 32, 2) ragged_decode_kernel(Args p) {
  static_assert(TileN == 32 * kColumnsPerLane, "a warp's lanes cover the tile's columns");
  static_assert(TileM == 1 || TileM == 2 || TileM == 4 || TileM == 8, "rows per item");
  namespace cg = cooperative_groups;
  constexpr int kThreads = Warps * 32;
  __shared__ GroupTable table;
  __shared__ float x[kChunk][TileM];
  // dynamic: each warp's sums, then the CTA's, in two buffers that alternate by item
  extern __shared__ float4 dynamic_smem[];
  float* stage = reinterpret_cast<float*>(dynamic_smem);
  float* partials = stage + Warps * TileM * TileN;

  scan_groups<kThreads, TileM>(p, table);
  zero_uncovered<D>(p, table.covered);

  cg::cluster_group cluster = cg::this_cluster();
  constexpr int splits = Splits;  // the launch's cluster: Splits CTAs along x
  const int rank = static_cast<int>(cluster.block_rank());
  const int clusters = gridDim.x / splits, cluster_id = blockIdx.x / splits;
  const int k0 = min(p.k, rank * p.k_per_cta), k1 = min(p.k, k0 + p.k_per_cta);
  const int64_t items = int64_t(table.chunks) * p.tiles_n;  // past 2^31 for a huge pinned call
  D* d = static_cast<D*>(p.d);
  int parity = 0;
  for (int64_t item = cluster_id; item < items; item += clusters, parity ^= 1) {
    const int chunk = static_cast<int>(item / p.tiles_n), tile = static_cast<int>(item % p.tiles_n);
    const int g = owner(table, p.groups, chunk);
    const int row0 = table.start[g] + (chunk - table.first_chunk[g]) * TileM;
    const int count = min(TileM, table.start[g] + table.rows[g] - row0);
    float* partial = partials + parity * TileM * TileN;
    // the item's live rows pick the narrowest row count that holds them
    if (count <= 1 || TileM == 1)
      stream_item<T, TileM, TileN, Warps, Stages, 1>(p, g, row0, count, tile, k0, k1, x, stage,
                                                     partial);
    else if (count <= 2 || TileM == 2)
      stream_item<T, TileM, TileN, Warps, Stages, (TileM < 2 ? TileM : 2)>(
          p, g, row0, count, tile, k0, k1, x, stage, partial);
    else if (count <= 4 || TileM == 4)
      stream_item<T, TileM, TileN, Warps, Stages, (TileM < 4 ? TileM : 4)>(
          p, g, row0, count, tile, k0, k1, x, stage, partial);
    else
      stream_item<T, TileM, TileN, Warps, Stages, TileM>(p, g, row0, count, tile, k0, k1, x, stage,
                                                         partial);
    cluster.sync();  // every CTA's partial of this item is complete and visible
    // CTA `rank` sums the (row, lane) slots rank, rank + splits, ... over the cluster
    for (int slot = rank + splits * threadIdx.x; slot < count * 32; slot += splits * kThreads) {
      const int r = slot / 32, lane = slot % 32;
      const int col = tile * TileN + lane * kColumnsPerLane;
      if (col >= p.n) continue;
      float sum[kColumnsPerLane] = {};
      for (int q = 0; q < splits; ++q) {
        const float* remote = cluster.map_shared_rank(partial, q);
#pragma unroll
        for (int j = 0; j < kColumnsPerLane; ++j)
          sum[j] += remote[(r * kColumnsPerLane + j) * 32 + lane];
      }
      alignas(16) D out[kColumnsPerLane];
#pragma unroll
      for (int j = 0; j < kColumnsPerLane; ++j) out[j] = static_cast<D>(sum[j]);
      constexpr int kVectors = sizeof(out) / 16;
#pragma unroll
      for (int v = 0; v < kVectors; ++v)
        reinterpret_cast<uint4*>(d + int64_t(row0 + r) * p.n + col)[v] =
            reinterpret_cast<const uint4*>(out)[v];
    }
  }
  // no CTA leaves while another may still read its partials; arriving
  // relaxed, as the output's stores need no ordering here (a plain
  // cluster.sync() makes every thread wait for them at a GPU-wide fence)
  __cluster_barrier_arrive_relaxed();
  __cluster_barrier_wait();
}

// Each CTA's share of K: a whole number of steps of `stages` rows, as items
// read A in registers a step at a time, so the last CTAs may get less or none.
inline int k_per_cta(int k, int splits, int stages) {
  const int share = (k + splits - 1) / splits;
  return (share + stages - 1) / stages * stages;
}

// The clusters of `splits` CTAs of `kernel` (`threads` each, `smem` dynamic
// bytes) resident at once on `device_id`; `prepare` runs on that device first
// (a kernel that asks for more shared memory sets its attribute there).
template <class Kernel, class Prepare>
int resident_clusters(Kernel kernel, int device_id, int splits, int threads, unsigned smem,
                      Prepare prepare) {
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) return 0;
  if (previous != device_id && cudaSetDevice(device_id) != cudaSuccess) return 0;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = splits;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(splits);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  if (prepare() != cudaSuccess ||
      cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess)
    clusters = 0;
  cudaGetLastError();
  if (previous != device_id) cudaSetDevice(previous);
  return clusters;
}

// What every decode row refuses, before its own operand rules.
inline const char* refused(const GemmProblem& p, const LaunchChoices& c, const DeviceSlots& s) {
  if (p.group_sizes == nullptr || p.batch < 1) return "a grouped variant needs group sizes";
  if (p.batch > kDecodeMaxGroups) return "a decode variant takes at most kDecodeMaxGroups groups";
  if (c.schedule != Schedule::kStatic) return "a decode variant runs the static schedule only";
  if (s.max_active_clusters < 1) return "a decode cluster does not fit on this device";
  return nullptr;
}

// Decode rows need no workspace: every CTA scans the group sizes itself.
inline size_t no_workspace(const GemmProblem&, const LaunchChoices&, const DeviceSlots&) {
  return 0;
}

// Launches (or records) a decode grid: clusters of `splits` CTAs, as many as
// the work items can use up to the resident ones. The items are bounded
// above, as every group's last chunk of tile_m rows may be partial.
template <class Kernel, class KernelArgs>
const char* launch_items(Kernel kernel, const GemmProblem& p, int tile_m, int tiles_n, int splits,
                         int threads, unsigned smem, int resident, cudaStream_t stream,
                         const KernelArgs& args) {
  const int64_t chunks = int64_t(p.m) / tile_m + std::min(p.batch, p.m) + 1;
  const int64_t clusters = std::min<int64_t>(chunks * tiles_n, resident);
  if (launch_or_record(kernel, dim3(static_cast<unsigned>(clusters * splits)), dim3(threads),
                       dim3(splits, 1, 1), smem, stream, args) != cudaSuccess) {
    cudaGetLastError();
    return "the decode kernel failed to launch";
  }
  return nullptr;
}

}  // namespace decode

// The menu row: TileM rows per item, TileN columns, TileK warps (each one
// row of B per step), Stages loads in flight per lane, a cluster of
// ClusterM CTAs splitting K. Row: the menu row's tag type.
template <class Row, class ElementAB, class ElementD, class LayoutA, class LayoutB, int TileM,
          int TileN, int TileK, int ClusterM, int ClusterN, int Stages, RaggedProblem Problem>
struct RaggedDecode {
  static_assert(Problem == RaggedProblem::kRaggedM, "decode rows are ragged_m");
  static_assert(std::is_same_v<LayoutA, cutlass::layout::RowMajor> &&
                    std::is_same_v<LayoutB, cutlass::layout::RowMajor>,
                "decode rows read A [rows, K] and B [G, K, N]");
  static_assert(ClusterN == 1 && ClusterM <= 8, "a portable cluster of CTAs along K");
  static constexpr int kThreads = TileK * 32;

  static constexpr auto kernel = &decode::ragged_decode_kernel<Row, ElementAB, ElementD, TileM,
                                                               TileN, TileK, Stages, ClusterM>;

  static constexpr int kDynamicSmem = (TileK + 2) * TileM * TileN * sizeof(float);

  // Lets the kernel take kDynamicSmem on the current device (once per device).
  static cudaError_t allow_dynamic_smem() {
    static std::mutex mu;
    static std::set<int> done;
    int device = 0;
    if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
    std::lock_guard<std::mutex> lock(mu);
    if (done.count(device)) return cudaSuccess;
    if (cudaError_t err =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kDynamicSmem);
        err != cudaSuccess)
      return err;
    done.insert(device);
    return cudaSuccess;
  }

  static const char* run(const GemmProblem& p, const LaunchChoices& c, const DeviceSlots& s, void*,
                         size_t, cudaStream_t stream) {
    if (const char* why = decode::refused(p, c, s)) return why;
    if (p.n % decode::kColumnsPerLane || p.k % decode::kColumnsPerLane)
      return "a decode variant needs N and K to be multiples of 8";
    if (allow_dynamic_smem() != cudaSuccess) {
      cudaGetLastError();
      return "the decode kernel cannot have its shared memory";
    }
    decode::Args args{p.a,
                      p.b,
                      p.d,
                      p.group_sizes,
                      p.batch,
                      p.m,
                      p.n,
                      p.k,
                      (p.n + TileN - 1) / TileN,
                      decode::k_per_cta(p.k, ClusterM, Stages)};
    return decode::launch_items(kernel, p, TileM, args.tiles_n, ClusterM, kThreads, kDynamicSmem,
                                s.max_active_clusters, stream, args);
  }

  static int max_active_clusters(int device_id) {
    return decode::resident_clusters(kernel, device_id, ClusterM, kThreads, kDynamicSmem,
                                     &allow_dynamic_smem);
  }

  static constexpr VariantOps ops{&decode::no_workspace, &run, &max_active_clusters};
};

}  // namespace jax_cluster::sm90
