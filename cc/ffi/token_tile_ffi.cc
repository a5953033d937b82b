// The token-tile quantization call: x [M, C] (bf16, f16 or f32) and the
// group sizes (int32 [G], on the device) -> values [C, rows] (e4m3 or e5m2)
// and scales [rows/128, C] (float32), rows of the block-aligned layout.
// Everything wrong comes back as ffi::Error.
#include "ffi/token_tile_ffi.h"

#include <string>

#include <cuda_runtime_api.h>

#include "common/contract.h"
#include "ffi/buffer_checks.h"
#include "ffi/fp8_quantize_dtypes.h"
#include "kernels/token_tile_quantize.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_cluster {
namespace {

ffi::Error invalid(const std::string& msg) {
  return ffi::Error::InvalidArgument(std::string(kQuantizeTokenTilesTarget) + ": " + msg);
}

// "" and the request when the buffers fit together, else what is wrong.
std::string request(const ffi::AnyBuffer& x, const ffi::Buffer<ffi::S32>& group_sizes,
                    const ffi::AnyBuffer& values, const ffi::AnyBuffer& scales,
                    TokenTileQuantize* q) {
  auto dx = x.dimensions(), dv = values.dimensions(), ds = scales.dimensions();
  if (dx.size() != 2 || dv.size() != 2 || ds.size() != 2 || group_sizes.dimensions().size() != 1)
    return "takes x [M, C] and group_sizes [G] and gives values [C, rows] and scales "
           "[rows/128, C]; got x " +
           shape_text(dx) + ", values " + shape_text(dv) + ", scales " + shape_text(ds);
  if (!fp8_input_of(x.element_type(), &q->input))
    return std::string("x must be bfloat16, float16 or float32, got ") +
           dtype_name(x.element_type());
  if (!fp8_output_of(values.element_type(), &q->output))
    return "values must be float8_e4m3fn or float8_e5m2";
  if (scales.element_type() != ffi::DataType::F32) return "scales must be float32";
  const int64_t columns = dx[1], rows = dv[1];
  if (dv[0] != columns || rows % kScaleBlock || ds[0] != rows / kScaleBlock || ds[1] != columns)
    return "values must be [C, rows] with rows a multiple of " + std::to_string(kScaleBlock) +
           " and scales [rows/" + std::to_string(kScaleBlock) + ", C]; got x " + shape_text(dx) +
           ", values " + shape_text(dv) + ", scales " + shape_text(ds);
  if (columns % kTokenTileColumns)
    return "C = " + std::to_string(columns) + " is not a multiple of " +
           std::to_string(kTokenTileColumns);
  if (!aligned16(x.untyped_data()) || !aligned16(values.untyped_data()))
    return "buffers must be 16-byte aligned";
  if (group_sizes.dimensions()[0] > INT32_MAX) return "too many groups";
  q->x = x.untyped_data();
  q->m = dx[0];
  q->columns = columns;
  q->group_sizes = group_sizes.typed_data();
  q->groups = static_cast<int>(group_sizes.dimensions()[0]);
  q->rows = rows;
  q->values = values.untyped_data();
  q->scales = static_cast<float*>(scales.untyped_data());
  return "";
}

ffi::Error execute(cudaStream_t stream, ffi::AnyBuffer x, ffi::Buffer<ffi::S32> group_sizes,
                   ffi::Result<ffi::AnyBuffer> values, ffi::Result<ffi::AnyBuffer> scales) {
  TokenTileQuantize q;
  if (std::string err = request(x, group_sizes, *values, *scales, &q); !err.empty())
    return invalid(err);
  if (const char* err = quantize_token_tiles(q, stream))
    return ffi::Error::Internal(std::string(kQuantizeTokenTilesTarget) + ": " + err);
  return ffi::Error::Success();
}

auto binding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::PlatformStream<cudaStream_t>>()
      .Arg<ffi::AnyBuffer>()
      .Arg<ffi::Buffer<ffi::S32>>()
      .Ret<ffi::AnyBuffer>()
      .Ret<ffi::AnyBuffer>();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(QuantizeTokenTiles, execute, binding(),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(QuantizeTokenTilesOutsideGraphs, execute, binding());

HandlerBundle token_tile_ffi_handlers() {
  return {nullptr, QuantizeTokenTiles, QuantizeTokenTilesOutsideGraphs};
}

}  // namespace jax_cluster
