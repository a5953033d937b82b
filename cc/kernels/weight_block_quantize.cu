// The weight-block quantization of weight_block_quantize.h: one CUDA block
// per 128 x 128 block of one group's matrix. Each thread loads its slices of
// the block's rows into registers (16-byte loads, a warp's contiguous), the
// block reduces their amax, and each thread writes its slices' fp8 bytes as
// they lie (values_kn). For values_nk the block stages 64 columns at a time
// in shared memory in w's own type and each thread writes 32 rows of one
// column as two contiguous 16-byte stores (the transpose).
#include <cstdint>

#include "common/contract.h"  // kScaleBlock
#include "kernels/fp8_quantize.cuh"
#include "kernels/weight_block_quantize.h"

namespace jax_cluster {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kBlock = kScaleBlock;            // rows and columns of a block
constexpr int kStaged = kBlock / 2;            // columns staged for the transpose at once
constexpr int kQuarters = kThreads / kStaged;  // each thread: one column, a quarter of the rows
constexpr int kRowsPerThread = kBlock / kQuarters;  // 32: two 16-byte stores of fp8
static_assert(kRowsPerThread == 32, "a thread writes its column's rows as two 16-byte stores");

// kBytes (8 or 4) of a thread's registers to global memory in one store
template <int kBytes>
__device__ void store_bytes(uint8_t* dst, const uint8_t* bytes) {
  if constexpr (kBytes == 8)
    *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(bytes);
  else *reinterpret_cast<uint32_t*>(dst) = *reinterpret_cast<const uint32_t*>(bytes);
}

template <class In, class Out>
__global__ void __launch_bounds__(kThreads)
    quantize_weight_blocks_kernel(const In* w, int64_t k, int64_t n, uint8_t* values_kn,
                                  uint8_t* values_nk, float* scales) {
  constexpr int kVec = 16 / sizeof(In);             // elements of one 16-byte load
  constexpr int kVecsPerRow = kBlock / kVec;        // a thread keeps one slice of each of its rows
  constexpr int kRowStep = kThreads / kVecsPerRow;  // rows between a thread's loads
  constexpr int kLoads = kBlock / kRowStep;
  static_assert(kThreads % kVecsPerRow == 0 && kBlock % kRowStep == 0, "whole rows per pass");
  __shared__ __align__(16) In staged[kBlock][kStaged];
  __shared__ float warp_amax[kWarps];

  const int64_t g = blockIdx.z, row0 = int64_t(blockIdx.y) * kBlock,
                col0 = int64_t(blockIdx.x) * kBlock;
  const int slice = threadIdx.x % kVecsPerRow, first = threadIdx.x / kVecsPerRow;
  const int64_t block_origin = (g * k + row0) * n + col0;  // of w and values_kn
  uint4 loaded[kLoads];
#pragma unroll
  for (int i = 0; i < kLoads; ++i)  // all loads in flight before any use
    loaded[i] = *reinterpret_cast<const uint4*>(w + block_origin + (first + i * kRowStep) * n +
                                                slice * kVec);

  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kLoads; ++i) amax = fp8::abs_max<In>(loaded[i], amax);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    amax = fp8::nan_max(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = amax;
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kWarps; ++i) amax = fp8::nan_max(amax, warp_amax[i]);
  const float scale = fp8::scale_of<Out>(amax);
  if (threadIdx.x == 0) scales[(g * (k / kBlock) + blockIdx.y) * (n / kBlock) + blockIdx.x] = scale;
  const float inverse = fp8::inverse_of(scale);

#pragma unroll
  for (int i = 0; i < kLoads; ++i) {  // values_kn: each slice where it lies
    __align__(8) uint16_t pairs[kVec / 2];
    fp8::quantized_vector<Out, In>(loaded[i], inverse, pairs);
    store_bytes<kVec>(values_kn + block_origin + (first + i * kRowStep) * n + slice * kVec,
                      reinterpret_cast<const uint8_t*>(pairs));
  }

  constexpr int kSlicesStaged = kStaged / kVec;
  const int column = threadIdx.x % kStaged, quarter = threadIdx.x / kStaged;
  for (int half = 0; half < kBlock / kStaged; ++half) {  // values_nk: 64 columns at a time
    const int staged_slice = slice - half * kSlicesStaged;
    if (staged_slice >= 0 && staged_slice < kSlicesStaged) {
#pragma unroll
      for (int i = 0; i < kLoads; ++i)
        *reinterpret_cast<uint4*>(&staged[first + i * kRowStep][staged_slice * kVec]) = loaded[i];
    }
    __syncthreads();
    const int64_t out_row = g * n + col0 + half * kStaged + column;
    fp8::store_column_rows<Out>(staged, quarter * kRowsPerThread, column, inverse,
                                values_nk + out_row * k + row0 + quarter * kRowsPerThread);
    __syncthreads();  // restaged for the next columns
  }
}

template <class In, class Out>
struct Launch {
  static const char* run(const WeightBlockQuantize& q, cudaStream_t stream) {
    dim3 grid(static_cast<unsigned>(q.n / kBlock), static_cast<unsigned>(q.k / kBlock),
              static_cast<unsigned>(q.groups));
    quantize_weight_blocks_kernel<In, Out><<<grid, kThreads, 0, stream>>>(
        static_cast<const In*>(q.w), q.k, q.n, static_cast<uint8_t*>(q.values_kn),
        static_cast<uint8_t*>(q.values_nk), q.scales);
    cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
  }
};

}  // namespace

const char* quantize_weight_blocks(const WeightBlockQuantize& q, cudaStream_t stream) {
  if (q.groups == 0 || q.k == 0 || q.n == 0) return nullptr;
  if (q.k % kBlock || q.n % kBlock) return "k and n must be multiples of 128";
  if (q.n / kBlock > INT32_MAX || q.k / kBlock > 65535 || q.groups > 65535)
    return "too many blocks for one launch";
  return fp8::launch_for_types<Launch>(q.input, q.output, q, stream);
}

}  // namespace jax_cluster
