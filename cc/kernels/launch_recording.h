// Launches taken down instead of made: while a LaunchRecording is active on
// this thread, our sm90 launch paths (the CUTLASS GEMM launch, the grouped
// preparation kernel, the decode kernel, the work queue's counter zeroing)
// append their kernels to it and touch no stream. XLA's record stage then adds
// those steps to its command buffer itself (ffi/record_stage.h) and, when the
// buffers move, updates only their parameters, instead of capturing the
// launches into a new graph.
#pragma once

#include <cstddef>
#include <cstring>
#include <tuple>

#include <cuda_runtime_api.h>

namespace jax_cluster {

struct RecordedStep {
  // one entry per kernel parameter, each a slice of the recording's bytes
  static constexpr int kMaxArgs = 24;
  const void* kernel = nullptr;
  dim3 grid, block, cluster;
  unsigned shared_bytes = 0;
  // launched as a programmatic dependent of the kernel before it (see
  // programmatic_launch below)
  bool overlap = false;
  int args = 0;
  size_t arg_offset[kMaxArgs] = {}, arg_bytes[kMaxArgs] = {};
};

struct LaunchRecording {
  static constexpr int kMaxSteps = 4;
  static constexpr size_t kMaxBytes = 3 * 4096;  // CUDA's parameter limit is 4 KB a kernel
  RecordedStep steps[kMaxSteps];
  int count = 0;
  size_t used = 0;
  alignas(64) unsigned char bytes[kMaxBytes];
  // the path reached something it cannot describe (too many steps, a launch
  // through CUTLASS's adapter): the call must be captured instead
  bool refused = false;

  const unsigned char* arg(const RecordedStep& s, int i) const { return bytes + s.arg_offset[i]; }

  template <class... Args>
  void take_kernel(const void* fn, dim3 grid, dim3 block, dim3 cluster, unsigned smem, bool overlap,
                   const Args&... args) {
    static_assert(sizeof...(Args) <= RecordedStep::kMaxArgs, "more kernel parameters than kept");
    RecordedStep* s = next();
    if (s == nullptr) return;
    s->kernel = fn, s->grid = grid, s->block = block, s->cluster = cluster;
    s->shared_bytes = smem, s->overlap = overlap;
    (keep(*s, &args, sizeof(Args)), ...);
  }

 private:
  RecordedStep* next() {
    if (refused || count == kMaxSteps) {
      refused = true;
      return nullptr;
    }
    steps[count] = RecordedStep{};
    return &steps[count++];
  }

  void keep(RecordedStep& s, const void* value, size_t n) {
    const size_t at = (used + 15) / 16 * 16;
    if (refused || at + n > kMaxBytes) {
      refused = true;
      return;
    }
    std::memcpy(bytes + at, value, n);
    s.arg_offset[s.args] = at, s.arg_bytes[s.args] = n, ++s.args;
    used = at + n;
  }
};

// The recording active on this thread, or nullptr.
LaunchRecording*& active_launch_recording();

// Where a kernel that waits for its inputs (griddepcontrol.wait) before its
// first global access is launched as a programmatic dependent of the kernel
// before it, so its launch and prologue (barrier set-up, descriptor prefetch)
// start once that kernel's blocks have released them (after their last
// mainloop) or exited, before the grid's completion is signalled and its
// writes flushed. By default on stream launches (the driver turns them into
// programmatic edges under capture) and on the kernel nodes added to XLA's
// command buffers; JAX_CLUSTER_PDL=stream: stream launches only; 0: nowhere.
enum class ProgrammaticLaunch { kNone, kStream, kStreamAndGraph };
ProgrammaticLaunch programmatic_launch();

// One launch of `fn` (a cluster launch when `cluster` has more than one CTA)
// through the driver's cuLaunchKernelEx on the kernel's CUfunction, looked up
// once per kernel and device: the runtime's cudaLaunchKernelExC resolves the
// function on every launch. JAX_CLUSTER_LAUNCH=runtime takes the runtime's
// path. `overlap`: a programmatic dependent launch, where programmatic_launch allows.
cudaError_t launch_kernel_ex(const void* fn, dim3 grid, dim3 block, dim3 cluster, unsigned smem,
                             bool overlap, cudaStream_t stream, void** args);

namespace detail {
template <class... Params, class... Args>
cudaError_t launch_or_record(void (*kernel)(Params...), dim3 grid, dim3 block, dim3 cluster,
                             unsigned smem, bool overlap, cudaStream_t stream,
                             const Args&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "one argument per kernel parameter");
  const void* fn = reinterpret_cast<const void*>(kernel);
  if (LaunchRecording* r = active_launch_recording()) {
    // each argument converted to its parameter's type first, as a launch would
    std::apply(
        [&](const auto&... p) { r->take_kernel(fn, grid, block, cluster, smem, overlap, p...); },
        std::tuple<Params...>(args...));
    return cudaSuccess;
  }
  std::tuple<Params...> values(args...);
  void* pointers[sizeof...(Params) + 1] = {};
  std::apply(
      [&](auto&... p) {
        int i = 0;
        ((pointers[i++] = &p), ...);
      },
      values);
  return launch_kernel_ex(fn, grid, block, cluster, smem, overlap, stream, pointers);
}
}  // namespace detail

// Launches `kernel` on `stream` (a cluster launch when `cluster` has more than
// one CTA), or records it.
template <class... Params, class... Args>
cudaError_t launch_or_record(void (*kernel)(Params...), dim3 grid, dim3 block, dim3 cluster,
                             unsigned smem, cudaStream_t stream, const Args&... args) {
  return detail::launch_or_record(kernel, grid, block, cluster, smem, false, stream, args...);
}

// The same for a kernel that waits for its inputs before touching global
// memory (CUTLASS's sm90 GEMM kernels built with CUTLASS_ENABLE_GDC_FOR_SM90),
// launched as a programmatic dependent of the kernel before it.
template <class... Params, class... Args>
cudaError_t launch_or_record_overlapped(void (*kernel)(Params...), dim3 grid, dim3 block,
                                        dim3 cluster, unsigned smem, cudaStream_t stream,
                                        const Args&... args) {
  return detail::launch_or_record(kernel, grid, block, cluster, smem, true, stream, args...);
}

}  // namespace jax_cluster
