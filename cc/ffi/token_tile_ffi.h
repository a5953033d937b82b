// XLA FFI handlers for "jax_cluster_quantize_token_tiles": the fp8 weight
// gradient's operands put into block-aligned token tiles in one kernel
// (kernels/token_tile_quantize.h). No Plan: the buffers say everything.
#pragma once

#include "xla/ffi/api/c_api.h"

namespace jax_cluster {

struct ExecuteHandlers {
  XLA_FFI_Handler* execute;                 // command-buffer compatible
  XLA_FFI_Handler* execute_outside_graphs;  // run as its own thunk, never traced
};

ExecuteHandlers token_tile_ffi_handlers();

}  // namespace jax_cluster
