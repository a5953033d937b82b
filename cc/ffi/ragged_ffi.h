// XLA FFI handlers for the grouped GEMM custom calls "jax_cluster_ragged_dot"
// and, with fp8 operands and float32 block scales, "jax_cluster_scaled_ragged_dot",
// and with the gated epilogue, "jax_cluster_gated_ragged_dot".
#pragma once

#include "ffi/handler_bundle.h"

namespace jax_cluster {
HandlerBundle ragged_ffi_handlers();
HandlerBundle scaled_ragged_ffi_handlers();
HandlerBundle gated_ragged_ffi_handlers();
}  // namespace jax_cluster
