// The Plan as C++ sees it: the kernel fields of jax_cluster.plan.Plan, with
// the same names. One X-macro lists them so the struct, the FFI attribute
// decoding and the module's plan_fields() cannot drift apart.
#pragma once

#include <cstdint>
#include <string_view>

#define JAX_CLUSTER_PLAN_FIELDS(X)            \
  X(std::string_view, variant)                \
  X(std::string_view, arch)                   \
  X(int64_t, tile_m)                          \
  X(int64_t, tile_n)                          \
  X(int64_t, tile_k)                          \
  X(int64_t, cluster_m)                       \
  X(int64_t, cluster_n)                       \
  X(int64_t, stages)                          \
  X(std::string_view, mma)                    \
  X(std::string_view, schedule)               \
  X(int64_t, splits)                          \
  X(std::string_view, raster)                 \
  X(int64_t, swizzle)                         \
  X(int64_t, sm_count)                        \
  X(int64_t, max_active_clusters)

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
