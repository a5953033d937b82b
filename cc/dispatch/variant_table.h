// The compiled variants, one entry per menu row (generated table).
#pragma once

#include <cstddef>
#include <string_view>

#include "common/gemm_problem.h"

namespace jax_cluster {

struct VariantEntry {
  const char* name;
  const char* arch;
  const char* dtype;  // A and B element type: "bf16" | "f16"
  const char* out;    // D element type: "bf16" | "f16" | "f32"
  char a_major;       // 'k': A is [M,K]; 'm': A is [K,M]
  char b_major;       // 'k': B is [N,K]; 'n': B is [K,N]
  int tile_m, tile_n, tile_k, cluster_m, cluster_n, stages;
  const char* mma;
  const char* kind;
  const char* problem;    // "dense" | "ragged_m" | "ragged_k"
  const char* epilogue;   // "none" | "bias_act" (fused bias, activation, C)
  const char* schedules;  // comma-separated schedules this kind can run
  const VariantOps& (*ops)();
};

extern const VariantEntry kVariants[];
extern const size_t kNumVariants;

// nullptr when no compiled variant has this name.
const VariantEntry* find_variant(std::string_view name);

}  // namespace jax_cluster
