// Host cost of one launch by each path a GEMM call can take on the H200, to
// say where a kernel call's host time goes outside XLA's command buffers.
// The kernel is a stand-in with a CUTLASS sm90 GEMM's launch shape: 132 CTAs
// of 384 threads, 196 KiB of dynamic shared memory, a 1 KiB parameter block
// (or 64 bytes), as 2x1 clusters or single CTAs; its body does nothing.
// Each path launches the kernel in batches (host wall time of the launches
// only, the stream drained between batches so no queue fills) and prints one
// JSON line: the median microseconds per launch over the batches.
//
//   nvcc -O2 -std=c++17 -arch=sm_90a -o /tmp/launch_cost benchmarks/investigations/launch_cost.cu
//   /tmp/launch_cost > launch_cost.jsonl
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

namespace {

constexpr int kCtas = 132, kThreads = 384, kSmem = 196 * 1024;
constexpr int kBatch = 200, kBatches = 25;

template <int kBytes>
struct Params {
  unsigned char bytes[kBytes];
};

template <int kBytes>
__global__ void stand_in(Params<kBytes> p) {
  extern __shared__ unsigned char smem[];
  if (p.bytes[0] == 0xAB && threadIdx.x == 0) smem[0] = 1;  // never: keeps the parameter live
}

template <int kBytes>
__global__ void __cluster_dims__(2, 1, 1) stand_in_2x1(Params<kBytes> p) {
  extern __shared__ unsigned char smem[];
  if (p.bytes[0] == 0xAB && threadIdx.x == 0) smem[0] = 1;
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

void check(CUresult e, const char* what) {
  if (e != CUDA_SUCCESS) {
    std::fprintf(stderr, "%s: CUresult %d\n", what, int(e));
    std::exit(1);
  }
}

template <class Fn>
Fn driver_entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found;
  check(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found), name);
  if (found != cudaDriverEntryPointSuccess) {
    std::fprintf(stderr, "%s: not found\n", name);
    std::exit(1);
  }
  return reinterpret_cast<Fn>(fn);
}

double median_us_per_launch(cudaStream_t stream, const std::function<void()>& launch) {
  for (int i = 0; i < kBatch; ++i) launch();  // warm-up: lazy loading, first-launch work
  check(cudaStreamSynchronize(stream), "warm-up");
  std::vector<double> per_launch;
  for (int b = 0; b < kBatches; ++b) {
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kBatch; ++i) launch();
    auto stop = std::chrono::steady_clock::now();
    per_launch.push_back(std::chrono::duration<double, std::micro>(stop - start).count() / kBatch);
    check(cudaStreamSynchronize(stream), "batch");
  }
  std::sort(per_launch.begin(), per_launch.end());
  return per_launch[per_launch.size() / 2];
}

void report(const char* path, double us) {
  std::printf("{\"path\": \"%s\", \"us_per_launch\": %.3f}\n", path, us);
  std::fflush(stdout);
}

template <int kBytes>
void runtime_ex(const char* path, const void* kernel, cudaStream_t stream, int cluster_x) {
  Params<kBytes> params{};
  void* args[] = {&params};
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cluster_x, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(kCtas), config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSmem, config.stream = stream;
  config.attrs = &attr, config.numAttrs = cluster_x > 1 ? 1 : 0;
  report(path, median_us_per_launch(
                   stream, [&] { check(cudaLaunchKernelExC(&config, kernel, args), path); }));
}

template <int kBytes>
void driver_ex(const char* path, const void* kernel, cudaStream_t stream, int cluster_x) {
  using LaunchEx = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);
  static auto launch_ex = driver_entry<LaunchEx>("cuLaunchKernelEx");
  cudaFunction_t function;
  check(cudaGetFuncBySymbol(&function, kernel), "cudaGetFuncBySymbol");
  Params<kBytes> params{};
  void* args[] = {&params};
  CUlaunchAttribute attr{};
  attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  attr.value.clusterDim.x = cluster_x, attr.value.clusterDim.y = 1, attr.value.clusterDim.z = 1;
  CUlaunchConfig config{};
  config.gridDimX = kCtas, config.gridDimY = 1, config.gridDimZ = 1;
  config.blockDimX = kThreads, config.blockDimY = 1, config.blockDimZ = 1;
  config.sharedMemBytes = kSmem, config.hStream = stream;
  config.attrs = &attr, config.numAttrs = cluster_x > 1 ? 1 : 0;
  report(path, median_us_per_launch(stream, [&] {
           check(launch_ex(&config, reinterpret_cast<CUfunction>(function), args, nullptr), path);
         }));
}

void tensor_maps(cudaStream_t stream) {
  using Encode =
      CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static auto encode = driver_entry<Encode>("cuTensorMapEncodeTiled");
  void* base = nullptr;
  check(cudaMalloc(&base, 1024 * 1024 * 2), "cudaMalloc");
  const cuuint64_t dims[2] = {1024, 1024}, strides[1] = {1024 * 2};
  const cuuint32_t box[2] = {64, 128}, element_strides[2] = {1, 1};
  alignas(64) CUtensorMap map;
  report("cuTensorMapEncodeTiled (one bf16 operand, 128B swizzle)",
         median_us_per_launch(stream, [&] {
           check(encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims, strides, box,
                        element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
                 "cuTensorMapEncodeTiled");
         }));
  report("cudaMemsetAsync (4 bytes: a work-queue counter)", median_us_per_launch(stream, [&] {
           check(cudaMemsetAsync(base, 0, 4, stream), "cudaMemsetAsync");
         }));
  check(cudaFree(base), "cudaFree");
}

template <class Kernel>
void allow_smem(Kernel kernel) {
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
        "cudaFuncSetAttribute");
}

}  // namespace

int main() {
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  allow_smem(stand_in<1024>), allow_smem(stand_in<64>), allow_smem(stand_in_2x1<1024>);
  const void* plain = reinterpret_cast<const void*>(stand_in<1024>);
  const void* small = reinterpret_cast<const void*>(stand_in<64>);
  const void* fixed = reinterpret_cast<const void*>(stand_in_2x1<1024>);

  runtime_ex<1024>("cudaLaunchKernelExC, 2x1 cluster attribute", plain, stream, 2);
  runtime_ex<1024>("cudaLaunchKernelExC, no cluster", plain, stream, 1);
  runtime_ex<64>("cudaLaunchKernelExC, no cluster, 64-byte parameters", small, stream, 1);
  runtime_ex<1024>("cudaLaunchKernelExC, __cluster_dims__(2,1,1) kernel", fixed, stream, 1);
  driver_ex<1024>("cuLaunchKernelEx (cached CUfunction), 2x1 cluster attribute", plain, stream, 2);
  driver_ex<1024>("cuLaunchKernelEx (cached CUfunction), no cluster", plain, stream, 1);
  driver_ex<1024>("cuLaunchKernelEx (cached CUfunction), __cluster_dims__(2,1,1) kernel", fixed,
                  stream, 1);
  Params<1024> params{};
  report("<<<>>>, __cluster_dims__(2,1,1) kernel", median_us_per_launch(stream, [&] {
           stand_in_2x1<1024><<<kCtas, kThreads, kSmem, stream>>>(params);
         }));
  tensor_maps(stream);
  check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  return 0;
}
