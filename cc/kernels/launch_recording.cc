#include "kernels/launch_recording.h"

#include <cuda.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>

namespace jax_cluster {
namespace {

using LaunchKernelEx = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);

LaunchKernelEx driver_launch() {
  static const LaunchKernelEx fn = [] {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuLaunchKernelEx", &entry, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return LaunchKernelEx{nullptr};
    }
    return reinterpret_cast<LaunchKernelEx>(entry);
  }();
  return fn;
}

bool runtime_launch_asked() {
  static const bool asked = [] {
    const char* v = std::getenv("JAX_CLUSTER_LAUNCH");
    return v != nullptr && std::strcmp(v, "runtime") == 0;
  }();
  return asked;
}

// The kernel's CUfunction in the current device's primary context.
CUfunction function_of(const void* fn, int device) {
  thread_local std::map<std::pair<const void*, int>, CUfunction> cache;
  auto key = std::make_pair(fn, device);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  cudaFunction_t function = nullptr;
  if (cudaGetFuncBySymbol(&function, fn) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return cache[key] = reinterpret_cast<CUfunction>(function);
}

cudaError_t runtime_launch(const void* fn, dim3 grid, dim3 block, dim3 cluster, unsigned smem,
                           bool overlap, cudaStream_t stream, void** args) {
  cudaLaunchAttribute attr[2];
  unsigned count = 0;
  if (cluster.x * cluster.y * cluster.z > 1) {
    attr[count].id = cudaLaunchAttributeClusterDimension;
    attr[count].val.clusterDim.x = cluster.x;
    attr[count].val.clusterDim.y = cluster.y;
    attr[count].val.clusterDim.z = cluster.z;
    ++count;
  }
  if (overlap) {
    attr[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = count;
  return cudaLaunchKernelExC(&config, fn, args);
}

}  // namespace

ProgrammaticLaunch programmatic_launch() {
  static const ProgrammaticLaunch where = [] {
    const char* v = std::getenv("JAX_CLUSTER_PDL");
    if (v != nullptr && std::strcmp(v, "0") == 0) return ProgrammaticLaunch::kNone;
    if (v != nullptr && std::strcmp(v, "stream") == 0) return ProgrammaticLaunch::kStream;
    return ProgrammaticLaunch::kStreamAndGraph;
  }();
  return where;
}

LaunchRecording*& active_launch_recording() {
  thread_local LaunchRecording* recording = nullptr;
  return recording;
}

cudaError_t launch_kernel_ex(const void* fn, dim3 grid, dim3 block, dim3 cluster, unsigned smem,
                             bool overlap, cudaStream_t stream, void** args) {
  overlap = overlap && programmatic_launch() != ProgrammaticLaunch::kNone;
  LaunchKernelEx launch = driver_launch();
  int device = 0;
  if (launch == nullptr || runtime_launch_asked() || cudaGetDevice(&device) != cudaSuccess)
    return runtime_launch(fn, grid, block, cluster, smem, overlap, stream, args);
  CUfunction function = function_of(fn, device);
  if (function == nullptr)
    return runtime_launch(fn, grid, block, cluster, smem, overlap, stream, args);
  CUlaunchAttribute attr[2];
  unsigned count = 0;
  if (cluster.x * cluster.y * cluster.z > 1) {
    attr[count].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr[count].value.clusterDim.x = cluster.x;
    attr[count].value.clusterDim.y = cluster.y;
    attr[count].value.clusterDim.z = cluster.z;
    ++count;
  }
  if (overlap) {
    attr[count].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr[count].value.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  CUlaunchConfig config = {};
  config.gridDimX = grid.x, config.gridDimY = grid.y, config.gridDimZ = grid.z;
  config.blockDimX = block.x, config.blockDimY = block.y, config.blockDimZ = block.z;
  config.sharedMemBytes = smem;
  config.hStream = reinterpret_cast<CUstream>(stream);
  config.attrs = attr;
  config.numAttrs = count;
  switch (launch(&config, function, args, nullptr)) {
    case CUDA_SUCCESS: return cudaSuccess;
    case CUDA_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
    case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
    case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: return cudaErrorLaunchOutOfResources;
    default: return cudaErrorLaunchFailure;
  }
}

}  // namespace jax_cluster
