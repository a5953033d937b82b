// Zeroing a few workspace bytes before a launch (the work queue's counter).
// Under XLA's record stage the zeroing is a recorded kernel step: the record
// API has no memset command, and its copy command would not be ordered after
// the commands before the call.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

namespace jax_cluster {

// Zeroes `bytes` at `at` in stream order, or records a kernel that does.
cudaError_t zero_or_record(void* at, size_t bytes, cudaStream_t stream);

}  // namespace jax_cluster
