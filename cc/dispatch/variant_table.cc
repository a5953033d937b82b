#include "dispatch/variant_table.h"

namespace jax_cluster {

const VariantEntry* find_variant(std::string_view name) {
  for (size_t i = 0; i < kNumVariants; ++i)
    if (name == kVariants[i].name) return &kVariants[i];
  return nullptr;
}

}  // namespace jax_cluster
