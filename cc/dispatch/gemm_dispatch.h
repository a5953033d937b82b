// Plan -> one compiled variant plus the runtime choices it leaves open.
#pragma once

#include <cstdint>
#include <string>

#include "common/gemm_problem.h"
#include "common/plan.h"
#include "dispatch/variant_table.h"

namespace jax_cluster {

struct Dispatch {
  const VariantEntry* variant = nullptr;
  LaunchChoices choices;
  DeviceSlots slots;
};

// Checks every Plan field against the menu row it names; returns "" on
// success, otherwise a message that names the offending field.
std::string resolve_plan(const Plan& plan, Dispatch* out);

// What check_device needs of a Plan, kept by value past the call's attributes.
struct PlanDeviceFields {
  std::string arch;
  int64_t sm_count = 0, max_active_clusters = 0;
};

// Checks that the device can run the resolved plan (architecture, SM count,
// residency of the requested clusters); returns "" on success.
std::string check_device(const PlanDeviceFields& plan, Dispatch* dispatch, int device_id);

}  // namespace jax_cluster
