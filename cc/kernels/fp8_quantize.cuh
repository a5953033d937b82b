// Device helpers the fp8 quantization kernels share, so that each computes
// the numbers of its primitive's XLA form (primitives/fp8_scaling.py): the
// scale is amax times the float32 reciprocal of the format's largest value
// (1 for an all-zero or NaN block), the values x times rcp.approx(scale),
// clipped to the format and rounded to nearest even.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/fp8_quantize.h"

namespace jax_cluster {
namespace fp8 {

__device__ inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline float to_float(__half v) { return __half2float(v); }
__device__ inline float to_float(float v) { return v; }

template <class Out>
struct Format;
template <>
struct Format<__nv_fp8_e4m3> {
  static constexpr float kLargest = 448.0f;
  static constexpr float kInverse = float(1.0 / 448.0);
};
template <>
struct Format<__nv_fp8_e5m2> {
  static constexpr float kLargest = 57344.0f;
  static constexpr float kInverse = float(1.0 / 57344.0);
};

// max that keeps a NaN, as jnp.max does
__device__ inline float nan_max(float a, float b) { return (b > a || b != b) ? b : a; }

template <class Out>
__device__ inline float scale_of(float amax) {
  return amax > 0.0f ? amax * Format<Out>::kInverse : 1.0f;  // a NaN amax gives 1, as in XLA
}

// XLA computes a division by a broadcast scale as a multiplication by its
// reciprocal, and lowers 1 / s to rcp.approx.f32 on the GPU
__device__ inline float inverse_of(float scale) {
  float inverse;
  asm("rcp.approx.f32 %0, %1;" : "=f"(inverse) : "f"(scale));
  return inverse;
}

template <class Out>
__device__ inline uint8_t quantized(float x, float inverse) {
  constexpr float kLargest = Format<Out>::kLargest;
  float v = x * inverse;
  v = v > kLargest ? kLargest : (v < -kLargest ? -kLargest : v);  // a NaN stays NaN
  return Out(v).__x;                                              // round to nearest even
}

// 32 staged rows of one column, from `first_row` on, quantized and written
// contiguously to `dst` (16-byte aligned) as two 16-byte stores: the
// transposed writes of both kernels.
template <class Out, class In, int kRows, int kColumns>
__device__ inline void store_column_rows(const In (&tile)[kRows][kColumns], int first_row,
                                         int column, float inverse, uint8_t* dst) {
  __align__(16) uint8_t bytes[32];
#pragma unroll
  for (int i = 0; i < 32; ++i)
    bytes[i] = quantized<Out>(to_float(tile[first_row + i][column]), inverse);
  reinterpret_cast<uint4*>(dst)[0] = reinterpret_cast<const uint4*>(bytes)[0];
  reinterpret_cast<uint4*>(dst)[1] = reinterpret_cast<const uint4*>(bytes)[1];
}

// The launch of `Kernel<In, Out>` for the request's element types.
template <template <class, class> class Launch, class Request>
const char* launch_for_types(Fp8Input input, Fp8Output output, const Request& request,
                             cudaStream_t stream) {
  auto with_output = [&](auto in) -> const char* {
    using In = decltype(in);
    return output == Fp8Output::kE4m3 ? Launch<In, __nv_fp8_e4m3>::run(request, stream)
                                      : Launch<In, __nv_fp8_e5m2>::run(request, stream);
  };
  switch (input) {
    case Fp8Input::kBf16: return with_output(__nv_bfloat16{});
    case Fp8Input::kF16: return with_output(__half{});
    case Fp8Input::kF32: return with_output(float{});
  }
  return "unsupported input type";
}

}  // namespace fp8
}  // namespace jax_cluster
