// XLA FFI handlers for "jax_cluster_quantize_token_tiles": the fp8 weight
// gradient's operands put into block-aligned token tiles in one kernel
// (kernels/token_tile_quantize.h). No Plan: the buffers say everything.
#pragma once

#include "ffi/handler_bundle.h"

namespace jax_cluster {

HandlerBundle token_tile_ffi_handlers();  // no instantiate stage

}  // namespace jax_cluster
