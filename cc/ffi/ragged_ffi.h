// XLA FFI handler for the grouped GEMM custom call "jax_cluster_ragged_dot".
#pragma once

#include "xla/ffi/api/c_api.h"

namespace jax_cluster {
XLA_FFI_Handler* ragged_ffi_handler();
}  // namespace jax_cluster
