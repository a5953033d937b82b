// The kernel-facing description of one GEMM launch: no XLA, no Python.
// D[l] = A[l] * B[l] for l < batch, all operands packed, then an optional
// fused epilogue; A is [M,K] (k_major) or [K,M]; B is [N,K] (k_major) or
// [K,N]; D is [M,N] row-major.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "common/contract.h"  // Schedule, Raster, Activation

namespace jax_cluster {

// The fused epilogue, D = act(alpha * A·B + beta * C + bias), for variants
// whose menu row has epilogue "bias_act"; the defaults mean D = A·B. bias is
// [N] (shared by the batch) and C is laid out like D; both have D's dtype.
struct EpilogueArgs {
  const void* bias = nullptr;
  const void* c = nullptr;
  float alpha = 1.0f, beta = 0.0f;
  Activation activation = Activation::kNone;

  bool is_identity() const {
    return bias == nullptr && c == nullptr && alpha == 1.0f && beta == 0.0f &&
           activation == Activation::kNone;
  }
};

// Grouped variants read (m, n, k) as the GEMM view of the whole launch
// (ragged_m: rows, N, K; ragged_k: K, N, rows), `batch` as the group count,
// and take the group sizes from device memory.
struct GemmProblem {
  int m = 0, n = 0, k = 0, batch = 1;
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  const int32_t* group_sizes = nullptr;  // grouped variants only
  EpilogueArgs epilogue;                 // "bias_act" variants only
  // Block-scaled (fp8) variants only: float32 scales. Dense: K-block-major,
  // scale_a [K/128, M] (A in 1x128 tiles along K), scale_b [K/128,
  // ceil(N/128)] (B in 128x128 blocks). Grouped: kernels/cutlass_grouped_gemm.cuh.
  const float* scale_a = nullptr;
  const float* scale_b = nullptr;
  // MX (mxe4m3) variants only: one e8m0 byte per 32 values along K, in
  // CUTLASS's sm100 scale-factor layout (M, resp. N, padded to 128 and K/32
  // to 4; see primitives/mx_scales.py).
  const void* mx_scale_a = nullptr;
  const void* mx_scale_b = nullptr;
};

// Runtime choices the compiled variant leaves open; all come from the Plan.
struct LaunchChoices {
  Schedule schedule = Schedule::kStatic;
  int splits = 1;
  Raster raster = Raster::kAlongN;
  int swizzle = 1;
};

// Facts about the device the launch runs on, queried once per device.
struct DeviceSlots {
  int device_id = 0;
  int sm_count = 0;
  int max_active_clusters = 0;
};

// Entry points every compiled variant provides (generated from the menu).
struct VariantOps {
  // Bytes of scratch the launch needs; 0 if none.
  size_t (*workspace_size)(const GemmProblem&, const LaunchChoices&, const DeviceSlots&);
  // nullptr on success, otherwise a static message naming the failure.
  const char* (*run)(const GemmProblem&, const LaunchChoices&, const DeviceSlots&, void* workspace,
                     size_t workspace_bytes, cudaStream_t stream);
  // cudaOccupancyMaxActiveClusters for this kernel on `device_id`.
  int (*max_active_clusters)(int device_id);
};

}  // namespace jax_cluster
