// Decodes the Plan from the custom call's "plan" dictionary attribute, and
// the fused epilogues' activation attribute.
#pragma once

#include <cstdint>
#include <iterator>
#include <string>

#include "common/plan.h"
#include "xla/ffi/api/ffi.h"

#define JAX_CLUSTER_MEMBER(type, name) , ::xla::ffi::StructMember<type>(#name)
#define JAX_CLUSTER_REGISTER_STRUCT(...) XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(__VA_ARGS__)
JAX_CLUSTER_REGISTER_STRUCT(::jax_cluster::Plan JAX_CLUSTER_PLAN_FIELDS(JAX_CLUSTER_MEMBER));
#undef JAX_CLUSTER_REGISTER_STRUCT
#undef JAX_CLUSTER_MEMBER

namespace jax_cluster {

// "" when `code` is an activation the contract names (and *out is it),
// otherwise what is wrong with it.
inline std::string activation_from_attr(int32_t code, Activation* out) {
  if (code < 0 || code >= static_cast<int32_t>(std::size(kActivationNames)))
    return std::string("activation must be one of ") + kActivationChoices + ", got " +
           std::to_string(code);
  *out = static_cast<Activation>(code);
  return "";
}

}  // namespace jax_cluster
