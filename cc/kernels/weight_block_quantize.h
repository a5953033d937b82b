// One pass that quantizes a stack of weights into DeepSeek-V3's 128 x 128
// blocks in both layouts the fp8 recipe reads: w [G, K, N] -> values_kn
// [G, K, N] (the input gradient's B, contracted over N) and values_nk
// [G, N, K] (the forward's B, contracted over K; the block-scaled kernels
// read B K-major), and scales [G, K/128, N/128] in float32, one per block:
// amax times the float32 reciprocal of the format's largest value, 1 for an
// all-zero block. The values are w times 1 / scale, clipped to the format,
// rounded to nearest even: the numbers of primitives/weight_block_quantize.py's
// XLA form. One read of w and two bytes written per value.
//
// Host-callable from the FFI handler; the kernel is in weight_block_quantize.cu.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/fp8_quantize.h"

namespace jax_cluster {

struct WeightBlockQuantize {
  const void* w = nullptr;           // [groups, k, n]
  int64_t groups = 0, k = 0, n = 0;  // k and n multiples of kScaleBlock
  void* values_kn = nullptr;         // [groups, k, n]
  void* values_nk = nullptr;         // [groups, n, k]
  float* scales = nullptr;           // [groups, k / kScaleBlock, n / kScaleBlock]
  Fp8Input input = Fp8Input::kBf16;
  Fp8Output output = Fp8Output::kE4m3;
};

// Launches on `stream`; nullptr on success, else a static message.
const char* quantize_weight_blocks(const WeightBlockQuantize& q, cudaStream_t stream);

}  // namespace jax_cluster
