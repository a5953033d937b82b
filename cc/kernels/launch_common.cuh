// Launch helpers shared by the sm90 and sm100 CUTLASS variants.
#pragma once

#include <cuda_runtime_api.h>

#include <cutlass/cluster_launch.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/device_kernel.h>

namespace jax_cluster {

// Runs a CUTLASS device adapter on `stream`: checks, initialises the
// XLA-provided workspace (stream-ordered) and launches. Never synchronises,
// so it is safe inside CUDA graph capture.
template <class Gemm>
const char* launch_cutlass(const typename Gemm::Arguments& args, void* workspace,
                           size_t workspace_bytes, cudaStream_t stream) {
  if (Gemm::can_implement(args) != cutlass::Status::kSuccess)
    return "CUTLASS cannot implement this problem (alignment or shape)";
  if (Gemm::get_workspace_size(args) > workspace_bytes)
    return "workspace buffer is smaller than the variant needs";
  Gemm gemm;
  if (gemm.initialize(args, workspace, stream) != cutlass::Status::kSuccess)
    return "kernel initialisation failed (shared memory attribute or workspace)";
  if (gemm.run(stream) != cutlass::Status::kSuccess) return "kernel launch failed";
  cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

// Clusters of this kernel that fit on the device at once, counting the
// dynamic shared memory it really uses; 0 if the query fails.
template <class Kernel>
int occupancy_max_active_clusters(int device_id) {
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) return 0;
  if (previous != device_id && cudaSetDevice(device_id) != cudaSuccess) return 0;
  const void* fn = reinterpret_cast<const void*>(&cutlass::device_kernel<Kernel>);
  int smem = static_cast<int>(Kernel::SharedStorageSize);
  int clusters = 0;
  if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) ==
      cudaSuccess) {
    cudaLaunchConfig_t config = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cute::size<0>(typename Kernel::ClusterShape{});
    attr[0].val.clusterDim.y = cute::size<1>(typename Kernel::ClusterShape{});
    attr[0].val.clusterDim.z = 1;
    config.gridDim = dim3(attr[0].val.clusterDim.x, attr[0].val.clusterDim.y, 1);
    config.blockDim = dim3(Kernel::MaxThreadsPerBlock, 1, 1);
    config.dynamicSmemBytes = smem;
    config.attrs = attr;
    config.numAttrs = 1;
    if (cudaOccupancyMaxActiveClusters(&clusters, fn, &config) != cudaSuccess) clusters = 0;
  }
  cudaGetLastError();  // a failed query must not poison the next launch
  if (previous != device_id) cudaSetDevice(previous);
  return clusters;
}

}  // namespace jax_cluster
