// The one global counter a dynamic scheduler hands tiles out from: four
// bytes of the launch workspace, zeroed in stream order before every launch
// (no host sync; safe in CUDA graphs; a recorded step under XLA's record stage).
#pragma once

#include <cstdint>

#include <cutlass/cuda_host_adapter.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/kernel_hardware_info.h>

#include "kernels/fill.h"

namespace jax_cluster::sm90 {

// A static scheduler's Params plus the counter's address.
template <class StaticParams>
struct WorkQueueParams : StaticParams {
  uint32_t* tile_counter = nullptr;

  static WorkQueueParams with_counter(StaticParams const& base, void* workspace) {
    WorkQueueParams p;
    static_cast<StaticParams&>(p) = base;
    p.tile_counter = static_cast<uint32_t*>(workspace);
    return p;
  }
};

struct WorkQueueCounter {
  template <class ProblemShape, class ElementAccumulator, class Arguments>
  static size_t get_workspace_size(Arguments const&, ProblemShape,
                                   cutlass::KernelHardwareInfo const&, uint32_t, uint32_t = 1,
                                   uint32_t = 1) {
    return sizeof(uint32_t);
  }

  template <class ProblemShape, class ElementAccumulator, class Arguments>
  static cutlass::Status initialize_workspace(Arguments const&, void* workspace,
                                              cudaStream_t stream, ProblemShape,
                                              cutlass::KernelHardwareInfo const&, uint32_t,
                                              uint32_t = 1, uint32_t = 1,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return fill_or_record(workspace, sizeof(uint32_t), 0, stream) == cudaSuccess
               ? cutlass::Status::kSuccess
               : cutlass::Status::kErrorInternal;
  }
};

}  // namespace jax_cluster::sm90
