// XLA FFI handler for the dense GEMM with a fused epilogue,
// "jax_cluster_gemm_epilogue": D = act(alpha * A·B + beta * C + bias[n]).
#pragma once

#include "xla/ffi/api/c_api.h"

namespace jax_cluster {
XLA_FFI_Handler* gemm_epilogue_ffi_handler();
}  // namespace jax_cluster
