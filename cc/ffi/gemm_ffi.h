// XLA FFI handler for the dense GEMM custom call "jax_cluster_gemm".
#pragma once

#include "ffi/handler_bundle.h"

namespace jax_cluster {
HandlerBundle gemm_ffi_handlers();
}  // namespace jax_cluster
