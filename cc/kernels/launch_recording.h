// A launch taken down instead of made: while a LaunchRecording is active on
// this thread, the sm90 CUTLASS launch path (kernels/cutlass_universal_gemm.cuh)
// fills it with the kernel, its dimensions and its parameter bytes and
// launches nothing. XLA's record stage then adds the kernel to its command
// buffer itself (ffi/record_stage.h), and updates only the parameters when
// the buffers move, instead of capturing the launch into a new graph.
#pragma once

#include <cstddef>
#include <cstring>

#include <cuda_runtime_api.h>

namespace jax_cluster {

struct LaunchRecording {
  static constexpr size_t kMaxParamBytes = 4096;  // CUDA's kernel parameter limit
  const void* kernel = nullptr;
  dim3 grid, block, cluster;
  unsigned shared_bytes = 0;
  size_t param_bytes = 0;
  alignas(64) unsigned char params[kMaxParamBytes];
  bool taken = false;
  // the path reached something it cannot describe (a second launch, a launch
  // through CUTLASS's adapter): the call must be captured instead
  bool refused = false;

  template <class Params>
  void take(const void* fn, dim3 g, dim3 b, dim3 c, unsigned smem, const Params& p) {
    static_assert(sizeof(Params) <= kMaxParamBytes, "kernel parameters past CUDA's limit");
    if (taken) {
      refused = true;
      return;
    }
    kernel = fn, grid = g, block = b, cluster = c, shared_bytes = smem;
    param_bytes = sizeof(Params);
    std::memcpy(params, &p, sizeof(Params));
    taken = true;
  }
};

// The recording active on this thread, or nullptr.
LaunchRecording*& active_launch_recording();

}  // namespace jax_cluster
