// The element types the fp8 quantization targets take, read from XLA's
// buffers (kernels/fp8_quantize.h names them).
#pragma once

#include "kernels/fp8_quantize.h"
#include "xla/ffi/api/ffi.h"

namespace jax_cluster {

// false for a type the kernels do not read
inline bool fp8_input_of(xla::ffi::DataType t, Fp8Input* out) {
  switch (t) {
    case xla::ffi::DataType::BF16: *out = Fp8Input::kBf16; return true;
    case xla::ffi::DataType::F16: *out = Fp8Input::kF16; return true;
    case xla::ffi::DataType::F32: *out = Fp8Input::kF32; return true;
    default: return false;
  }
}

// false for a type the kernels do not write
inline bool fp8_output_of(xla::ffi::DataType t, Fp8Output* out) {
  switch (t) {
    case xla::ffi::DataType::F8E4M3FN: *out = Fp8Output::kE4m3; return true;
    case xla::ffi::DataType::F8E5M2: *out = Fp8Output::kE5m2; return true;
    default: return false;
  }
}

}  // namespace jax_cluster
