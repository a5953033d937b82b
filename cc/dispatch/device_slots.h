// Device facts the handler checks a Plan against, queried once per device
// (and per variant for residency) and cached.
#pragma once

#include "dispatch/variant_table.h"

namespace jax_cluster {

struct DeviceFacts {
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
  int smem_per_block_optin = 0;
  int l2_bytes = 0;
  char name[256] = {};
};

// false if the device cannot be queried.
bool device_facts(int device_id, DeviceFacts* out);

// cudaOccupancyMaxActiveClusters for `v` on `device_id`, cached.
int cached_max_active_clusters(const VariantEntry& v, int device_id);

}  // namespace jax_cluster
