#include "dispatch/device_slots.h"

#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include <cuda_runtime_api.h>

namespace jax_cluster {

bool device_facts(int device_id, DeviceFacts* out) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device_id) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  out->sm_count = prop.multiProcessorCount;
  out->cc_major = prop.major;
  out->cc_minor = prop.minor;
  out->smem_per_block_optin = static_cast<int>(prop.sharedMemPerBlockOptin);
  out->l2_bytes = prop.l2CacheSize;
  std::strncpy(out->name, prop.name, sizeof(out->name) - 1);
  return true;
}

int cached_max_active_clusters(const VariantEntry& v, int device_id) {
  static std::mutex mu;
  static std::map<std::pair<const VariantEntry*, int>, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_pair(&v, device_id);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  int clusters = v.ops().max_active_clusters(device_id);
  if (clusters > 0) cache[key] = clusters;  // do not cache a failed query
  return clusters;
}

}  // namespace jax_cluster
