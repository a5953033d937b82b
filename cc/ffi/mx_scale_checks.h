// The check both block-scaled FFI handlers apply to an MX scale buffer.
#pragma once

#include <cstdint>
#include <string>

#include "common/mx_scale_layout.h"
#include "ffi/buffer_checks.h"
#include "xla/ffi/api/ffi.h"

namespace jax_cluster {

// "" when `scale` is e8m0 with `want` dimensions, else what is wrong with it.
template <size_t Rank>
std::string check_mx_scale(const char* label, const xla::ffi::AnyBuffer& scale,
                           const int64_t (&want)[Rank]) {
  auto dims = scale.dimensions();
  if (scale.element_type() != xla::ffi::DataType::F8E8M0FNU)
    return std::string(label) + " must be float8_e8m0fnu (MX scales)";
  bool same = dims.size() == Rank;
  for (size_t i = 0; same && i < Rank; ++i) same = dims[i] == want[i];
  if (!same) {
    std::string shape = "[";
    for (size_t i = 0; i < Rank; ++i) shape += (i ? ", " : "") + std::to_string(want[i]);
    return std::string(label) + " must be " + shape + "] (the kernel's scale-factor layout)";
  }
  if (!aligned16(scale.untyped_data())) return std::string(label) + " must be 16-byte aligned";
  return "";
}

}  // namespace jax_cluster
