#include "dispatch/gemm_dispatch.h"

#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "common/contract.h"
#include "dispatch/device_slots.h"

namespace jax_cluster {
namespace {

std::string mismatch(const char* field, int64_t plan, int64_t menu) {
  return "plan." + std::string(field) + " = " + std::to_string(plan) + " but variant has " +
         std::to_string(menu);
}

bool lists(std::string_view csv, std::string_view item) {
  while (!csv.empty()) {
    size_t comma = csv.find(',');
    if (csv.substr(0, comma) == item) return true;
    if (comma == std::string_view::npos) break;
    csv.remove_prefix(comma + 1);
  }
  return false;
}

bool arch_runs_on(std::string_view arch, int cc_major, int cc_minor) {
  for (const ArchCapability& c : kArchCapabilities)
    if (c.arch == arch && c.cc_major == cc_major && c.cc_minor == cc_minor) return true;
  return false;
}

// "9.0", or "10.0 or 10.3" should an arch run on two: for messages.
std::string capabilities(std::string_view arch) {
  std::string out;
  for (const ArchCapability& c : kArchCapabilities)
    if (c.arch == arch)
      out += (out.empty() ? "" : " or ") + std::to_string(c.cc_major) + "." +
             std::to_string(c.cc_minor);
  return out;
}

struct CachedFacts {
  bool ok;
  DeviceFacts facts;
};

const CachedFacts& facts_for(int device_id) {
  static std::mutex mu;
  static std::map<int, CachedFacts> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(device_id);
  if (it == cache.end()) {
    CachedFacts entry{};
    entry.ok = device_facts(device_id, &entry.facts);
    it = cache.emplace(device_id, entry).first;
  }
  return it->second;
}

}  // namespace

std::string resolve_plan(const Plan& plan, Dispatch* out) {
  const VariantEntry* v = find_variant(plan.variant);
  if (v == nullptr)
    return "plan.variant '" + std::string(plan.variant) + "' is not compiled into this build";
  if (plan.arch != v->arch)
    return "plan.arch '" + std::string(plan.arch) + "' but variant is " + v->arch;
  if (plan.tile_m != v->tile_m) return mismatch("tile_m", plan.tile_m, v->tile_m);
  if (plan.tile_n != v->tile_n) return mismatch("tile_n", plan.tile_n, v->tile_n);
  if (plan.tile_k != v->tile_k) return mismatch("tile_k", plan.tile_k, v->tile_k);
  if (plan.cluster_m != v->cluster_m) return mismatch("cluster_m", plan.cluster_m, v->cluster_m);
  if (plan.cluster_n != v->cluster_n) return mismatch("cluster_n", plan.cluster_n, v->cluster_n);
  if (plan.stages != v->stages) return mismatch("stages", plan.stages, v->stages);
  if (plan.mma != v->mma)
    return "plan.mma '" + std::string(plan.mma) + "' but variant is " + v->mma;
  int schedule = index_of(kScheduleNames, plan.schedule);
  if (schedule < 0)
    return "plan.schedule '" + std::string(plan.schedule) + "' is not one of " + kScheduleChoices;
  if (!lists(v->schedules, plan.schedule))
    return "plan.schedule '" + std::string(plan.schedule) + "' is not one of " + v->schedules +
           " (variant kind " + v->kind + ")";

  LaunchChoices& c = out->choices;
  c.schedule = static_cast<Schedule>(schedule);
  if (plan.splits < 1 || plan.splits > 64) return "plan.splits must be in [1, 64]";
  if (c.schedule != Schedule::kSplitK && plan.splits != 1)
    return "plan.splits must be 1 unless plan.schedule is '" +
           std::string(name(Schedule::kSplitK)) + "'";
  c.splits = static_cast<int>(plan.splits);
  int raster = index_of(kRasterNames, plan.raster);
  if (raster < 0)
    return "plan.raster '" + std::string(plan.raster) + "' is not one of " + kRasterChoices;
  c.raster = static_cast<Raster>(raster);
  if (index_of(kSwizzles, plan.swizzle) < 0)
    return "plan.swizzle = " + std::to_string(plan.swizzle) + " is not one of " + kSwizzleChoices;
  c.swizzle = static_cast<int>(plan.swizzle);
  if (plan.sm_count < 1) return "plan.sm_count must be positive";
  if (plan.max_active_clusters < 1) return "plan.max_active_clusters must be positive";
  out->slots.sm_count = static_cast<int>(plan.sm_count);
  out->slots.max_active_clusters = static_cast<int>(plan.max_active_clusters);
  out->variant = v;
  return "";
}

std::string check_device(const PlanDeviceFields& plan, Dispatch* dispatch, int device_id) {
  const CachedFacts& f = facts_for(device_id);
  if (!f.ok) return "cannot query CUDA device " + std::to_string(device_id);
  if (!arch_runs_on(plan.arch, f.facts.cc_major, f.facts.cc_minor))
    return "plan is for " + plan.arch + " (compute capability " + capabilities(plan.arch) +
           ") but device " + std::to_string(device_id) + " has compute capability " +
           std::to_string(f.facts.cc_major) + "." + std::to_string(f.facts.cc_minor);
  if (plan.sm_count > f.facts.sm_count)
    return mismatch("sm_count", plan.sm_count, f.facts.sm_count) + " on this device";
  int resident = cached_max_active_clusters(*dispatch->variant, device_id);
  if (resident < 1) return "cudaOccupancyMaxActiveClusters found no room for this variant";
  // More clusters than can be resident could deadlock stream-K's fix-up.
  if (plan.max_active_clusters > resident)
    return "plan.max_active_clusters = " + std::to_string(plan.max_active_clusters) + " but only " +
           std::to_string(resident) + " clusters fit on this device";
  dispatch->slots.device_id = device_id;
  return "";
}

}  // namespace jax_cluster
