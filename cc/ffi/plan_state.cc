#include "ffi/plan_state.h"

#include <utility>

namespace jax_cluster {

xla::ffi::TypeId PlanState::id = {};

std::unique_ptr<PlanState> PlanState::resolve(const Plan& plan) {
  auto state = std::make_unique<PlanState>();
  state->error_ = resolve_plan(plan, &state->dispatch_);
  state->device_.arch = std::string(plan.arch);
  state->device_.sm_count = plan.sm_count;
  state->device_.max_active_clusters = plan.max_active_clusters;
  return state;
}

std::string PlanState::dispatch_on(int device_id, Dispatch* out) {
  bool cached = device_id >= 0 && device_id < kDevices;
  if (cached && checked_[device_id].load(std::memory_order_acquire) == kReady) {
    *out = dispatch_;
    out->slots.device_id = device_id;
    return "";
  }
  Dispatch dispatch = dispatch_;
  // check_device's own caches lock; a failed check is made again next call
  if (std::string err = check_device(device_, &dispatch, device_id); !err.empty()) return err;
  if (cached) checked_[device_id].store(kReady, std::memory_order_release);
  *out = std::move(dispatch);
  return "";
}

XLA_FFI_TypeId* plan_state_type_id() { return &PlanState::id; }

const XLA_FFI_TypeInfo* plan_state_type_info() {
  static const XLA_FFI_TypeInfo info = xla::ffi::MakeTypeInfo<PlanState>();
  return &info;
}

}  // namespace jax_cluster
