// XLA FFI handler for the grouped GEMM custom call "jax_cluster_ragged_dot".
#pragma once

#include "ffi/handler_bundle.h"

namespace jax_cluster {
HandlerBundle ragged_ffi_handlers();
}  // namespace jax_cluster
