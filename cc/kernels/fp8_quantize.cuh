// Device helpers the fp8 quantization kernels share, so that each computes
// the numbers of its primitive's XLA form (primitives/fp8_scaling.py): the
// scale is amax times the float32 reciprocal of the format's largest value
// (1 for an all-zero or NaN block), the values x times rcp.approx(scale),
// clipped to the format and rounded to nearest even. The kernels only
// stream, so beside the bytes their cost is what they issue per value: the
// helpers take values two at a time where the hardware does (packed amax,
// paired conversions).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

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
  static constexpr float kInverse = float(1.0 / 448.0);
  static constexpr __nv_fp8_interpretation_t kKind = __NV_E4M3;
};
template <>
struct Format<__nv_fp8_e5m2> {
  static constexpr float kInverse = float(1.0 / 57344.0);
  static constexpr __nv_fp8_interpretation_t kKind = __NV_E5M2;
};

// max that keeps a NaN, as jnp.max does (one FMNMX.NAN)
__device__ inline float nan_max(float a, float b) {
  float m;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(m) : "f"(a), "f"(b));
  return m;
}

// The NaN-keeping max of |v| over a 16-byte vector of In and `amax`. bf16
// and f16 pairs are compared packed: the largest magnitude of a type is
// exact in it, so converting it last gives the float32 amax.
template <class In>
__device__ inline float abs_max(const uint4& v, float amax) {
  if constexpr (sizeof(In) == 4) {
    const float* f = reinterpret_cast<const float*>(&v);
#pragma unroll
    for (int e = 0; e < 4; ++e) amax = nan_max(amax, fabsf(f[e]));
    return amax;
  } else {
    using Pair = std::conditional_t<std::is_same_v<In, __half>, __half2, __nv_bfloat162>;
    const Pair* p = reinterpret_cast<const Pair*>(&v);
    Pair m = __habs2(p[0]);
#pragma unroll
    for (int e = 1; e < 4; ++e) m = __hmax2_nan(m, __habs2(p[e]));
    return nan_max(amax, nan_max(to_float(m.x), to_float(m.y)));
  }
}

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

// x and y scaled and rounded to nearest even, x in the low byte. The
// conversion's satfinite takes what lies past the format's largest value to
// it, as XLA's clip before its conversion does, and keeps a NaN.
template <class Out>
__device__ inline uint16_t quantized_pair(float x, float y, float inverse) {
  return __nv_cvt_float2_to_fp8x2(make_float2(x * inverse, y * inverse), __NV_SATFINITE,
                                  Format<Out>::kKind);
}

// The fp8 bytes of a 16-byte vector of In, in order, as pairs.
template <class Out, class In>
__device__ inline void quantized_vector(const uint4& v, float inverse, uint16_t* pairs) {
  const In* e = reinterpret_cast<const In*>(&v);
#pragma unroll
  for (int i = 0; i < 16 / int(sizeof(In)); i += 2)
    pairs[i / 2] = quantized_pair<Out>(to_float(e[i]), to_float(e[i + 1]), inverse);
}

// 32 staged rows of one column, from `first_row` on, quantized and written
// contiguously to `dst` (16-byte aligned) as two 16-byte stores: the
// transposed writes of both kernels.
template <class Out, class In, int kRows, int kColumns>
__device__ inline void store_column_rows(const In (&tile)[kRows][kColumns], int first_row,
                                         int column, float inverse, uint8_t* dst) {
  __align__(16) uint16_t pairs[16];
#pragma unroll
  for (int i = 0; i < 32; i += 2)
    pairs[i / 2] = quantized_pair<Out>(to_float(tile[first_row + i][column]),
                                       to_float(tile[first_row + i + 1][column]), inverse);
  reinterpret_cast<uint4*>(dst)[0] = reinterpret_cast<const uint4*>(pairs)[0];
  reinterpret_cast<uint4*>(dst)[1] = reinterpret_cast<const uint4*>(pairs)[1];
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
