#include "ffi/record_stage.h"

#include <array>
#include <atomic>
#include <cstring>
#include <string_view>

#include "common/contract.h"
#include "dispatch/gemm_dispatch.h"
#include "ffi/buffer_checks.h"
#include "ffi/kernel_image.h"
#include "kernels/launch_recording.h"

namespace ffi = xla::ffi;

namespace jax_cluster {

namespace {

// Makes `r` the thread's recording for the scope's life.
class ScopedRecording {
 public:
  explicit ScopedRecording(LaunchRecording* r) : previous_(active_launch_recording()) {
    active_launch_recording() = r;
  }
  ~ScopedRecording() { active_launch_recording() = previous_; }

 private:
  LaunchRecording* previous_;
};

// A dense variant with no workspace to initialise: its run() goes through
// launch_kernel once and touches the stream for nothing else (an sm100 one
// refuses the recording there, and the call is captured).
bool describable(const VariantEntry& v, size_t workspace_bytes) {
  return std::string_view(v.problem) == "dense" && workspace_bytes == 0;
}

// The SM number of the cubins built for `arch` (the device check has matched
// the device to it); 0 for an arch the contract does not know.
int cubin_sm(std::string_view arch) {
  for (const ArchCapability& c : kArchCapabilities)
    if (c.arch == arch) return c.cc_major * 10 + c.cc_minor;
  return 0;
}

std::atomic<const XLA_FFI_Api*> probed_api{nullptr};

ffi::Error probe_noop() { return ffi::Error::Success(); }

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(FfiApiProbeTyped, probe_noop, ffi::Ffi::Bind());

extern "C" XLA_FFI_Error* FfiApiProbe(XLA_FFI_CallFrame* frame) {
  if (frame != nullptr && frame->api != nullptr) probed_api.store(frame->api);
  return FfiApiProbeTyped(frame);
}

XLA_FFI_Handler* ffi_api_probe() { return FfiApiProbe; }

const XLA_FFI_Api* captured_ffi_api() { return probed_api.load(); }

std::string register_bundle(const char* name, const char* platform,
                            const XLA_FFI_Handler_Bundle& bundle, XLA_FFI_Handler_Traits traits) {
  const XLA_FFI_Api* api = captured_ffi_api();
  if (api == nullptr) return "XLA has not called the probe target, so its FFI API is unknown";
  XLA_FFI_Handler_Register_Args args;
  args.struct_size = XLA_FFI_Handler_Register_Args_STRUCT_SIZE;
  args.extension_start = nullptr;
  args.name = XLA_FFI_ByteSpan{name, std::strlen(name)};
  args.platform = XLA_FFI_ByteSpan{platform, std::strlen(platform)};
  args.bundle = bundle;
  args.traits = traits;
  if (XLA_FFI_Error* err = api->XLA_FFI_Handler_Register(&args)) {
    ffi::Error error = ffi::internal::ErrorPolicy::TakeError(api, err);
    return error.message();
  }
  return "";
}

ffi::Error record_launch(const char* target, RecordContext& ctx, PlanState& state,
                         const GemmProblem& problem, ffi::AnyBuffer& workspace,
                         cudaStream_t stream) {
  // anything this path cannot describe is traced from the execute handler,
  // which also reports the plan's and the buffers' errors
  auto capture = [&] { return ctx.RequestStreamCapture(); };
  int device_id = 0;
  Dispatch dispatch;
  if (!state.error().empty() || problem.m == 0 || problem.n == 0 || problem.k == 0 ||
      problem.batch == 0 || poison_output() || !current_device(&device_id) ||
      !state.dispatch_on(device_id, &dispatch).empty())
    return capture();
  const VariantEntry& v = *dispatch.variant;
  const VariantOps& ops = v.ops();
  if (!describable(v, ops.workspace_size(problem, dispatch.choices, dispatch.slots)))
    return capture();
  LaunchRecording launch;
  {
    ScopedRecording scope(&launch);
    if (const char* err = ops.run(problem, dispatch.choices, dispatch.slots,
                                  workspace.untyped_data(), workspace.size_bytes(), stream))
      return ffi::Error::Internal(std::string(target) + " (" + v.name + "): " + err);
  }
  std::string why;
  const KernelImage* image = launch.taken && !launch.refused
                                 ? find_kernel_image(launch.kernel, cubin_sm(v.arch), &why)
                                 : nullptr;
  if (image == nullptr) return capture();
  const std::array<ffi::KernelArg, 1> args = {ffi::HostValue{launch.params, launch.param_bytes}};
  if (ctx.action() == ffi::RecordAction::kCreate) {
    const bool clustered = launch.cluster.x * launch.cluster.y * launch.cluster.z > 1;
    XLA_FFI_LaunchDims dims = {
        {int32_t(launch.grid.x), int32_t(launch.grid.y), int32_t(launch.grid.z)},
        {int32_t(launch.block.x), int32_t(launch.block.y), int32_t(launch.block.z)},
        clustered ? XLA_FFI_Dim3{int32_t(launch.cluster.x), int32_t(launch.cluster.y),
                                 int32_t(launch.cluster.z)}
                  : XLA_FFI_Dim3{0, 0, 0}};
    auto command = ctx.CreateLaunch(image->name.c_str(), image->cubin, image->cubin_bytes,
                                    ffi::SourceFormat::kCubin, dims, launch.shared_bytes,
                                    /*uses_pdl=*/false, args);
    return command.has_value() ? ffi::Error::Success() : command.error();
  }
  if (ctx.commands().size() != 1)
    return ffi::Error::Internal(std::string(target) + ": expected the one kernel node it recorded");
  return ctx.UpdateLaunch(ctx.commands()[0], args);
}

}  // namespace jax_cluster
