// Filling a buffer's bytes in stream order: the work queue's counter (zeros)
// and the poisoned outputs of JAX_CLUSTER_POISON_OUTPUT (0xFF). Under XLA's
// record stage the fill is a recorded kernel step: the record API has no
// memset command, and its copy command would not be ordered after the
// commands before the call.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

namespace jax_cluster {

// Sets `bytes` bytes at `at` to `value` in stream order, or records a kernel that does.
cudaError_t fill_or_record(void* at, size_t bytes, unsigned char value, cudaStream_t stream);

}  // namespace jax_cluster
