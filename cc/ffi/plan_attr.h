// Decodes the Plan from the custom call's "plan" dictionary attribute.
#pragma once

#include "common/plan.h"
#include "xla/ffi/api/ffi.h"

#define JAX_CLUSTER_MEMBER(type, name) , ::xla::ffi::StructMember<type>(#name)
#define JAX_CLUSTER_REGISTER_STRUCT(...) XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(__VA_ARGS__)
JAX_CLUSTER_REGISTER_STRUCT(::jax_cluster::Plan JAX_CLUSTER_PLAN_FIELDS(JAX_CLUSTER_MEMBER));
#undef JAX_CLUSTER_REGISTER_STRUCT
#undef JAX_CLUSTER_MEMBER
