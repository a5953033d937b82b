// XLA FFI handler for the block-scaled fp8 GEMM custom call
// "jax_cluster_scaled_gemm": D = (A, scale_a) . (B, scale_b).
#pragma once

#include "ffi/handler_bundle.h"

namespace jax_cluster {
HandlerBundle scaled_gemm_ffi_handlers();
}  // namespace jax_cluster
