// The Plan as C++ sees it: the kernel fields of jax_cluster.planning.plan.Plan,
// with the same names. The generated X-macro JAX_CLUSTER_PLAN_FIELDS lists
// them, so the struct, the FFI attribute decoding and the module's
// plan_fields() cannot drift from the Python side.
#pragma once

#include "common/contract.h"

namespace jax_cluster {

struct Plan {
#define JAX_CLUSTER_DECLARE(type, name) type name;
  JAX_CLUSTER_PLAN_FIELDS(JAX_CLUSTER_DECLARE)
#undef JAX_CLUSTER_DECLARE
};

inline constexpr const char* kPlanFieldNames[] = {
#define JAX_CLUSTER_NAME(type, name) #name,
    JAX_CLUSTER_PLAN_FIELDS(JAX_CLUSTER_NAME)
#undef JAX_CLUSTER_NAME
};

}  // namespace jax_cluster
