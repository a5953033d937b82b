// Checks and helpers both FFI handlers apply to XLA's buffers.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

#include <cuda_runtime_api.h>

#include "common/contract.h"
#include "dispatch/variant_table.h"
#include "xla/ffi/api/ffi.h"

namespace jax_cluster {

// The contract's name and size of an element type; "unsupported" and 0 for
// any type outside it.
inline const char* dtype_name(xla::ffi::DataType t) {
  switch (t) {
#define JAX_CLUSTER_DTYPE_NAME(name, bytes, enumerator) \
  case xla::ffi::DataType::enumerator: return #name;
    JAX_CLUSTER_DTYPES(JAX_CLUSTER_DTYPE_NAME)
#undef JAX_CLUSTER_DTYPE_NAME
    default: return "unsupported";
  }
}

inline int dtype_bytes(xla::ffi::DataType t) {
  switch (t) {
#define JAX_CLUSTER_DTYPE_BYTES(name, bytes, enumerator) \
  case xla::ffi::DataType::enumerator: return bytes;
    JAX_CLUSTER_DTYPES(JAX_CLUSTER_DTYPE_BYTES)
#undef JAX_CLUSTER_DTYPE_BYTES
    default: return 0;
  }
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// "[d0, d1, ...]": a buffer's dimensions, for error messages.
inline std::string shape_text(xla::ffi::Span<const int64_t> d) {
  std::string out = "[";
  for (size_t i = 0; i < d.size(); ++i) out += (i ? ", " : "") + std::to_string(d[i]);
  return out + "]";
}

// The element type a dtype's buffers hold (mxe4m3's values are e4m3).
constexpr std::string_view value_dtype(std::string_view name) {
  for (const ValueDtype& row : kValueDtypes)
    if (row.name == name) return row.value;
  return name;
}

// "" when A, B and D have the element types the variant was compiled for.
inline std::string check_dtypes(const VariantEntry& v, const xla::ffi::AnyBuffer& a,
                                const xla::ffi::AnyBuffer& b, const xla::ffi::AnyBuffer& d) {
  const std::string_view values = value_dtype(v.dtype);
  if (dtype_name(a.element_type()) == values && dtype_name(b.element_type()) == values &&
      std::string(dtype_name(d.element_type())) == v.out)
    return "";
  return std::string("dtypes (") + dtype_name(a.element_type()) + ", " +
         dtype_name(b.element_type()) + ") -> " + dtype_name(d.element_type()) +
         " do not match variant " + v.name;
}

// "" when TMA can read every row: 16-byte leading dimensions and 16-byte
// aligned buffers. Call after check_dtypes: the element sizes come from the
// contract's dtype table.
inline std::string check_tma_alignment(int64_t lead_a, int64_t lead_b, int64_t n,
                                       const xla::ffi::AnyBuffer& a, const xla::ffi::AnyBuffer& b,
                                       const xla::ffi::AnyBuffer& d) {
  if ((lead_a * dtype_bytes(a.element_type())) % 16 ||
      (lead_b * dtype_bytes(b.element_type())) % 16 || (n * dtype_bytes(d.element_type())) % 16)
    return "leading dimensions must be multiples of 16 bytes (TMA)";
  if (!aligned16(a.untyped_data()) || !aligned16(b.untyped_data()) || !aligned16(d.untyped_data()))
    return "buffers must be 16-byte aligned";
  return "";
}

// JAX_CLUSTER_POISON_OUTPUT=1 fills D with 0xFF bytes (NaN in every output
// dtype) before each launch, so a test sees any element the kernel skips.
inline bool poison_output() {
  static const bool on = [] {
    const char* v = std::getenv("JAX_CLUSTER_POISON_OUTPUT");
    return v != nullptr && v[0] == '1';
  }();
  return on;
}

// XLA makes the stream's context current before running the call;
// cudaStreamGetDevice would fail on the streams it captures into graphs.
inline bool current_device(int* device_id) {
  if (cudaGetDevice(device_id) == cudaSuccess) return true;
  cudaGetLastError();
  return false;
}

}  // namespace jax_cluster
