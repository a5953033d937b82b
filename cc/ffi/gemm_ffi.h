// XLA FFI handler for the dense GEMM custom call "jax_cluster_gemm".
#pragma once

#include "xla/ffi/api/c_api.h"

namespace jax_cluster {
XLA_FFI_Handler* gemm_ffi_handler();
}  // namespace jax_cluster
