// The last steps every FFI handler shares once the buffers are checked: the
// device and residency checks (once per device, see PlanState), optional output
// poisoning, the workspace check and the launch on XLA's stream, or zeroing
// the output of an empty sum.
#pragma once

#include <string>

#include <cuda_runtime_api.h>

#include "common/gemm_problem.h"
#include "dispatch/gemm_dispatch.h"
#include "ffi/buffer_checks.h"
#include "ffi/plan_state.h"
#include "kernels/fill.h"
#include "xla/ffi/api/ffi.h"

namespace jax_cluster {

// An empty sum (K = 0): the result is zero, with no kernel launched.
inline xla::ffi::Error zero_output(const char* target, xla::ffi::AnyBuffer& d,
                                   cudaStream_t stream) {
  if (cudaMemsetAsync(d.untyped_data(), 0, d.size_bytes(), stream) != cudaSuccess)
    return xla::ffi::Error::Internal(std::string(target) + ": cudaMemsetAsync failed");
  return xla::ffi::Error::Success();
}

inline xla::ffi::Error launch_variant(const char* target, PlanState& state,
                                      const GemmProblem& problem, xla::ffi::AnyBuffer& d,
                                      xla::ffi::AnyBuffer& workspace, cudaStream_t stream) {
  namespace ffi = xla::ffi;
  auto invalid = [&](const std::string& msg) {
    return ffi::Error::InvalidArgument(std::string(target) + ": " + msg);
  };
  int device_id = 0;
  if (!current_device(&device_id))
    return ffi::Error::Internal(std::string(target) + ": no current CUDA device");
  Dispatch dispatch;
  if (std::string err = state.dispatch_on(device_id, &dispatch); !err.empty()) return invalid(err);
  if (poison_output() &&
      fill_or_record(d.untyped_data(), d.size_bytes(), 0xFF, stream) != cudaSuccess)
    return ffi::Error::Internal(std::string(target) + ": poisoning the output failed");
  const VariantEntry& v = *dispatch.variant;
  const VariantOps& ops = v.ops();
  size_t need = ops.workspace_size(problem, dispatch.choices, dispatch.slots);
  if (need > workspace.size_bytes())
    return invalid("workspace has " + std::to_string(workspace.size_bytes()) +
                   " bytes, variant needs " + std::to_string(need));
  if (const char* err = ops.run(problem, dispatch.choices, dispatch.slots, workspace.untyped_data(),
                                workspace.size_bytes(), stream))
    return ffi::Error::Internal(std::string(target) + " (" + v.name + "): " + err);
  return ffi::Error::Success();
}

}  // namespace jax_cluster
