#include "kernels/kept_params.h"

#include <atomic>

#include <cuda_runtime_api.h>

namespace jax_cluster {
namespace {

using ReplaceAddress = CUresult (*)(CUtensorMap*, void*);

// Through the runtime's driver entry point, as the launches reach the driver.
ReplaceAddress driver_replace_address() {
  static const ReplaceAddress fn = [] {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapReplaceAddress", &entry, 12000,
                                         cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return ReplaceAddress{nullptr};
    }
    return reinterpret_cast<ReplaceAddress>(entry);
  }();
  return fn;
}

std::atomic<int64_t> kept_count{0}, repointed_count{0};

}  // namespace

bool replace_tma_address(const CUtensorMap* descriptor, const void* address) {
  ReplaceAddress replace = driver_replace_address();
  // the descriptor lives in the caller's own copy of the Params
  return replace != nullptr &&
         replace(const_cast<CUtensorMap*>(descriptor), const_cast<void*>(address)) == CUDA_SUCCESS;
}

KeptParamsCounts kept_params_counts() { return {kept_count.load(), repointed_count.load()}; }

void count_kept_params(bool repointed) {
  (repointed ? repointed_count : kept_count).fetch_add(1, std::memory_order_relaxed);
}

}  // namespace jax_cluster
