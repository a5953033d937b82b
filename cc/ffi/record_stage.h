// XLA's record stage for our FFI handlers. Inside a command buffer (a CUDA
// graph) XLA otherwise captures an FFI call's launches into a new graph every
// time the call's buffers move, at about 10 us a call; a record handler adds
// the kernel nodes once and, when the buffers move, only updates their
// parameters. The handler runs the variant with a LaunchRecording active
// (kernels/launch_recording.h): every sm90 launch path describes its kernel
// instead of launching it (the poisoning fill, the grouped preparation
// kernel, the work queue's counter fill, the GEMM or decode kernel), and each
// becomes a node after the one before. Calls it cannot describe (sm100,
// CUTLASS's own workspace initialisation, an empty sum) ask XLA to capture
// the execute handler as before.
//
// jax.ffi.register_ffi_target passes no record handler to XLA, so targets
// with one are registered through the XLA FFI API itself, whose address the
// probe target captures when XLA first calls it (registration queries a
// handler's metadata).
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

#include "common/gemm_problem.h"
#include "ffi/plan_state.h"
#include "xla/ffi/api/ffi.h"
#include "xla/ffi/api/record_api.h"

namespace jax_cluster {

using RecordContext = xla::ffi::internal::RecordContextBase<xla::ffi::internal::ErrorPolicy>;

struct RecordExtension : xla::ffi::internal::RecordExtensionBase<RecordContext> {
  // Later minor versions add source formats; the frame used here is unchanged.
  static bool Support(int32_t major, int32_t minor) { return major == 0 && minor >= 1; }
};

// What every record handler binds first; the buffers follow, as in execute.
inline auto bind_record() {
  return xla::ffi::Ffi::BindRecord()
      .Ctx<xla::ffi::Extension<RecordExtension>>()
      .Ctx<xla::ffi::State<PlanState>>()
      .Ctx<xla::ffi::PlatformStream<cudaStream_t>>();
}

// Adds the call's kernels to XLA's command buffer, updates the nodes'
// parameters, or asks XLA to capture the execute handler instead.
xla::ffi::Error record_launch(const char* target, RecordContext& ctx, PlanState& state,
                              const GemmProblem& problem, xla::ffi::AnyBuffer& d,
                              xla::ffi::AnyBuffer& workspace, cudaStream_t stream);

// How the record stage has answered XLA so far, in this process: commands
// created, parameter updates, calls left to XLA's capture, and calls whose
// launches were kept from an earlier call with the same buffers.
struct RecordCounts {
  int64_t created = 0, updated = 0, captured = 0, reused = 0;
};
RecordCounts record_counts();

// The probe target's handler: a no-op that keeps the XLA FFI API it is called with.
XLA_FFI_Handler* ffi_api_probe();
// That API, or nullptr before XLA has called the probe.
const XLA_FFI_Api* captured_ffi_api();
// Registers `bundle` under `name` for `platform` through the captured API;
// "" on success, otherwise why not.
std::string register_bundle(const char* name, const char* platform,
                            const XLA_FFI_Handler_Bundle& bundle, XLA_FFI_Handler_Traits traits);

}  // namespace jax_cluster
