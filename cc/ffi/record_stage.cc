#include "ffi/record_stage.h"

#include <atomic>
#include <cstring>
#include <string_view>
#include <vector>

#include "common/contract.h"
#include "dispatch/gemm_dispatch.h"
#include "ffi/buffer_checks.h"
#include "ffi/kernel_image.h"
#include "kernels/fill.h"
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

// The SM number of the cubins built for `arch` (the device check has matched
// the device to it); 0 for an arch the contract does not know.
int cubin_sm(std::string_view arch) {
  for (const ArchCapability& c : kArchCapabilities)
    if (c.arch == arch) return c.cc_major * 10 + c.cc_minor;
  return 0;
}

std::atomic<const XLA_FFI_Api*> probed_api{nullptr};
std::atomic<int64_t> created_count{0}, updated_count{0}, captured_count{0}, reused_count{0};

ffi::Error probe_noop() { return ffi::Error::Success(); }

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(FfiApiProbeTyped, probe_noop, ffi::Ffi::Bind());

extern "C" XLA_FFI_Error* FfiApiProbe(XLA_FFI_CallFrame* frame) {
  if (frame != nullptr && frame->api != nullptr) probed_api.store(frame->api);
  return FfiApiProbeTyped(frame);
}

XLA_FFI_Handler* ffi_api_probe() { return FfiApiProbe; }

const XLA_FFI_Api* captured_ffi_api() { return probed_api.load(); }

RecordCounts record_counts() {
  return {created_count.load(), updated_count.load(), captured_count.load(), reused_count.load()};
}

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
                         const GemmProblem& problem, ffi::AnyBuffer& d, ffi::AnyBuffer& workspace,
                         cudaStream_t stream) {
  // anything this path cannot describe is traced from the execute handler,
  // which also reports the plan's and the buffers' errors
  auto capture = [&] {
    captured_count.fetch_add(1);
    return ctx.RequestStreamCapture();
  };
  int device_id = 0;
  Dispatch dispatch;
  if (!state.error().empty() || problem.m == 0 || problem.n == 0 || problem.k == 0 ||
      problem.batch == 0 || !current_device(&device_id) ||
      !state.dispatch_on(device_id, &dispatch).empty())
    return capture();
  const VariantEntry& v = *dispatch.variant;
  const VariantOps& ops = v.ops();
  if (ops.workspace_size(problem, dispatch.choices, dispatch.slots) > workspace.size_bytes())
    return capture();
  const RecordedLaunches::Key key = RecordedLaunches::key_of(
      device_id, problem, workspace.untyped_data(), workspace.size_bytes());
  LaunchRecording steps;
  if (state.recorded.find(key, &steps)) {
    reused_count.fetch_add(1);
  } else {
    {
      ScopedRecording scope(&steps);
      if (poison_output() &&
          fill_or_record(d.untyped_data(), d.size_bytes(), 0xFF, stream) != cudaSuccess)
        return capture();
      if (const char* err = ops.run(problem, dispatch.choices, dispatch.slots,
                                    workspace.untyped_data(), workspace.size_bytes(), stream))
        return ffi::Error::Internal(std::string(target) + " (" + v.name + "): " + err);
    }
    if (steps.refused || steps.count == 0) return capture();
    state.recorded.keep(key, steps);
  }
  auto args_of = [&](const RecordedStep& s) {
    std::vector<ffi::KernelArg> args;
    for (int j = 0; j < s.args; ++j)
      args.push_back(ffi::HostValue{steps.arg(s, j), s.arg_bytes[j]});
    return args;
  };
  if (ctx.action() == ffi::RecordAction::kCreate) {
    // only a new node needs the cubins: all looked up before the first
    // command, so a refusal leaves none behind
    const KernelImage* images[LaunchRecording::kMaxSteps] = {};
    std::string why;
    for (int i = 0; i < steps.count; ++i)
      if ((images[i] = find_kernel_image(steps.steps[i].kernel, cubin_sm(v.arch), &why)) == nullptr)
        return capture();
    // XLA orders a launch after the commands before the call; each further
    // step goes after the one before it, and the last is the one XLA orders
    // the later commands after
    std::vector<const XLA_FFI_Command*> after;
    for (int i = 0; i < steps.count; ++i) {
      const RecordedStep& s = steps.steps[i];
      const bool clustered = s.cluster.x * s.cluster.y * s.cluster.z > 1;
      XLA_FFI_LaunchDims dims = {
          {int32_t(s.grid.x), int32_t(s.grid.y), int32_t(s.grid.z)},
          {int32_t(s.block.x), int32_t(s.block.y), int32_t(s.block.z)},
          clustered ? XLA_FFI_Dim3{int32_t(s.cluster.x), int32_t(s.cluster.y), int32_t(s.cluster.z)}
                    : XLA_FFI_Dim3{0, 0, 0}};
      const bool overlap =
          s.overlap && programmatic_launch() == ProgrammaticLaunch::kStreamAndGraph;
      auto command = ctx.CreateLaunch(images[i]->name.c_str(), images[i]->cubin,
                                      images[i]->cubin_bytes, ffi::SourceFormat::kCubin, dims,
                                      s.shared_bytes, overlap, args_of(s), after);
      if (!command.has_value() && overlap)  // a command buffer that takes no programmatic edge
        command = ctx.CreateLaunch(images[i]->name.c_str(), images[i]->cubin,
                                   images[i]->cubin_bytes, ffi::SourceFormat::kCubin, dims,
                                   s.shared_bytes, false, args_of(s), after);
      if (!command.has_value()) return command.error();
      after.assign(1, command.value());
      created_count.fetch_add(1);
    }
    return ffi::Error::Success();
  }
  if (int64_t(ctx.commands().size()) != steps.count)
    return ffi::Error::Internal(std::string(target) + ": expected the " +
                                std::to_string(steps.count) + " commands it recorded");
  for (int i = 0; i < steps.count; ++i)
    if (ffi::Error updated = ctx.UpdateLaunch(ctx.commands()[i], args_of(steps.steps[i]));
        updated.failure())
      return updated;
  updated_count.fetch_add(steps.count);
  return ffi::Error::Success();
}

}  // namespace jax_cluster
