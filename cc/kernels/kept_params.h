// Kernel parameters kept per problem, for the sm90 dense kernels whose Params
// depend on a call's buffers only through the TMA descriptors of A, B and D:
// the plain epilogue (no C, no bias), no block scales, no workspace. A call
// whose problem, launch choices and device match a kept entry copies its
// Params and moves the three descriptors to its own buffers
// (cuTensorMapReplaceAddress) instead of converting CUTLASS's arguments and
// encoding the descriptors again, which took 0.7 us of host time a call on
// an H200 and is paid by every call whose buffers moved: in a jit, most.
#pragma once

#include <array>
#include <cstdint>

#include <cuda.h>

#include "common/gemm_problem.h"

namespace jax_cluster {

// What a kept kernel's Params depend on besides the buffers' addresses.
struct ParamsKey {
  int m = 0, n = 0, k = 0, batch = 0;
  int device_id = 0, sm_count = 0, max_active_clusters = 0;
  Schedule schedule = Schedule::kStatic;
  int splits = 0;
  Raster raster = Raster::kAlongN;
  int swizzle = 0;

  static ParamsKey of(const GemmProblem& p, const LaunchChoices& c, const DeviceSlots& s) {
    return {
        p.m,        p.n,      p.k,      p.batch,  s.device_id, s.sm_count, s.max_active_clusters,
        c.schedule, c.splits, c.raster, c.swizzle};
  }
  bool operator==(const ParamsKey& o) const {
    return m == o.m && n == o.n && k == o.k && batch == o.batch && device_id == o.device_id &&
           sm_count == o.sm_count && max_active_clusters == o.max_active_clusters &&
           schedule == o.schedule && splits == o.splits && raster == o.raster &&
           swizzle == o.swizzle;
  }
};

// Moves `descriptor` to `address` in place; false when the driver lacks
// cuTensorMapReplaceAddress or refuses the address (then the call describes
// its launch afresh).
bool replace_tma_address(const CUtensorMap* descriptor, const void* address);

// Launches described afresh and kept, and launches made from kept Params, in
// this process (the GPU tests check that moved buffers take the second path).
struct KeptParamsCounts {
  int64_t kept = 0, repointed = 0;
};
KeptParamsCounts kept_params_counts();
void count_kept_params(bool repointed);

// The last few Params of one kernel (one instance per kernel and host thread).
template <class Params>
class KeptParams {
 public:
  // The Params kept for `key`, or nullptr.
  const Params* find(const ParamsKey& key) const {
    for (const Entry& e : entries_)
      if (e.used && e.key == key) return &e.params;
    return nullptr;
  }

  // Keeps `params` for `key` in place of the oldest entry.
  void keep(const ParamsKey& key, const Params& params) {
    Entry& e = entries_[next_];
    next_ = (next_ + 1) % kEntries;
    e.used = true, e.key = key, e.params = params;
    count_kept_params(false);
  }

 private:
  static constexpr int kEntries = 4;
  struct Entry {
    bool used = false;
    ParamsKey key;
    Params params;
  };
  std::array<Entry, kEntries> entries_{};
  int next_ = 0;
};

}  // namespace jax_cluster
