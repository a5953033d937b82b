// The per-call-site state of every handler: what depends only on the Plan and
// the call's attributes, decoded and resolved against the menu once, when XLA
// instantiates the executable (the FFI instantiate stage), and the device
// checks, made once per device. A call then only checks its buffers and launches.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include <cuda_runtime_api.h>

#include "common/gemm_problem.h"
#include "common/plan.h"
#include "dispatch/gemm_dispatch.h"
#include "ffi/recorded_launches.h"
#include "xla/ffi/api/ffi.h"

namespace jax_cluster {

class PlanState {
 public:
  static xla::ffi::TypeId id;  // assigned when the type is registered with XLA

  // Resolves `plan` against the menu. A plan the menu refuses still gives a
  // state: its error is returned by every call, as a call would have found it.
  static std::unique_ptr<PlanState> resolve(const Plan& plan);

  // "" when the plan resolved; otherwise what is wrong with it.
  const std::string& error() const { return error_; }
  const VariantEntry& variant() const { return *dispatch_.variant; }
  // Marks a resolved plan unusable at this call site (say, a grouped variant
  // named by a dense call); the first reason given is kept.
  void refuse(std::string why) {
    if (error_.empty()) error_ = std::move(why);
  }

  // The dispatch for `device_id`, checked against the device (arch, SM count,
  // residency) on its first call there; "" on success.
  std::string dispatch_on(int device_id, Dispatch* out);

  // The fused epilogue's scalars, for the call sites that have them.
  EpilogueArgs epilogue;
  // The record stage's launches for the buffers this call site last saw.
  RecordedLaunches recorded;

 private:
  static constexpr int kDevices = 64;  // devices cached; others are checked every call
  enum : int8_t { kUnchecked = 0, kReady = 1 };

  std::string error_;
  Dispatch dispatch_;
  PlanDeviceFields device_;
  std::array<std::atomic<int8_t>, kDevices> checked_{};
};

// The instantiate-stage result every handler returns.
using PlanStateOr = xla::ffi::ErrorOr<std::unique_ptr<PlanState>>;

// What every execute handler binds first: its call site's state and XLA's
// stream; the buffers follow, and no attribute (the state holds them).
inline auto bind_execute() {
  return xla::ffi::Ffi::Bind()
      .Ctx<xla::ffi::State<PlanState>>()
      .Ctx<xla::ffi::PlatformStream<cudaStream_t>>();
}

// The capsule payloads jax.ffi.register_ffi_type needs for PlanState.
XLA_FFI_TypeId* plan_state_type_id();
const XLA_FFI_TypeInfo* plan_state_type_info();

}  // namespace jax_cluster
