// XLA FFI handler for the dense GEMM with a fused epilogue,
// "jax_cluster_gemm_epilogue": D = act(alpha * A·B + beta * C + bias[n]).
#pragma once

#include "ffi/handler_bundle.h"

namespace jax_cluster {
HandlerBundle gemm_epilogue_ffi_handlers();
}  // namespace jax_cluster
