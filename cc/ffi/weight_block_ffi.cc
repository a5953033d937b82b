// The weight-block quantization call: w [G, K, N] (bf16, f16 or f32) ->
// values_kn [G, K, N] and values_nk [G, N, K] (both e4m3 or both e5m2) and
// scales [G, K/128, N/128] (float32). Everything wrong comes back as
// ffi::Error.
#include "ffi/weight_block_ffi.h"

#include <string>

#include <cuda_runtime_api.h>

#include "common/contract.h"
#include "ffi/buffer_checks.h"
#include "ffi/fp8_quantize_dtypes.h"
#include "kernels/weight_block_quantize.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_cluster {
namespace {

ffi::Error invalid(const std::string& msg) {
  return ffi::Error::InvalidArgument(std::string(kQuantizeWeightBlocksTarget) + ": " + msg);
}

// "" and the request when the buffers fit together, else what is wrong.
std::string request(const ffi::AnyBuffer& w, const ffi::AnyBuffer& kn, const ffi::AnyBuffer& nk,
                    const ffi::AnyBuffer& scales, WeightBlockQuantize* q) {
  auto dw = w.dimensions(), dkn = kn.dimensions(), dnk = nk.dimensions(), ds = scales.dimensions();
  const std::string shapes = "w " + shape_text(dw) + ", values_kn " + shape_text(dkn) +
                             ", values_nk " + shape_text(dnk) + ", scales " + shape_text(ds);
  if (dw.size() != 3 || dkn.size() != 3 || dnk.size() != 3 || ds.size() != 3)
    return "takes w [G, K, N] and gives values_kn [G, K, N], values_nk [G, N, K] and scales "
           "[G, K/128, N/128]; got " +
           shapes;
  if (!fp8_input_of(w.element_type(), &q->input))
    return std::string("w must be bfloat16, float16 or float32, got ") +
           dtype_name(w.element_type());
  if (!fp8_output_of(kn.element_type(), &q->output) || nk.element_type() != kn.element_type())
    return "values_kn and values_nk must both be float8_e4m3fn or both float8_e5m2";
  if (scales.element_type() != ffi::DataType::F32) return "scales must be float32";
  const int64_t groups = dw[0], k = dw[1], n = dw[2];
  if (k % kScaleBlock || n % kScaleBlock)
    return "K and N must be multiples of " + std::to_string(kScaleBlock) + "; got " + shapes;
  if (dkn[0] != groups || dkn[1] != k || dkn[2] != n || dnk[0] != groups || dnk[1] != n ||
      dnk[2] != k || ds[0] != groups || ds[1] != k / kScaleBlock || ds[2] != n / kScaleBlock)
    return "shapes do not fit together: " + shapes;
  if (!aligned16(w.untyped_data()) || !aligned16(kn.untyped_data()) ||
      !aligned16(nk.untyped_data()))
    return "buffers must be 16-byte aligned";
  q->w = w.untyped_data();
  q->groups = groups;
  q->k = k;
  q->n = n;
  q->values_kn = kn.untyped_data();
  q->values_nk = nk.untyped_data();
  q->scales = static_cast<float*>(scales.untyped_data());
  return "";
}

ffi::Error execute(cudaStream_t stream, ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> values_kn,
                   ffi::Result<ffi::AnyBuffer> values_nk, ffi::Result<ffi::AnyBuffer> scales) {
  WeightBlockQuantize q;
  if (std::string err = request(w, *values_kn, *values_nk, *scales, &q); !err.empty())
    return invalid(err);
  if (const char* err = quantize_weight_blocks(q, stream))
    return ffi::Error::Internal(std::string(kQuantizeWeightBlocksTarget) + ": " + err);
  return ffi::Error::Success();
}

auto binding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::PlatformStream<cudaStream_t>>()
      .Arg<ffi::AnyBuffer>()
      .Ret<ffi::AnyBuffer>()
      .Ret<ffi::AnyBuffer>()
      .Ret<ffi::AnyBuffer>();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(QuantizeWeightBlocks, execute, binding(),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(QuantizeWeightBlocksOutsideGraphs, execute, binding());

HandlerBundle weight_block_ffi_handlers() {
  return {nullptr, QuantizeWeightBlocks, QuantizeWeightBlocksOutsideGraphs};
}

}  // namespace jax_cluster
