// XLA FFI handlers for "jax_cluster_quantize_weight_blocks": a stack of
// weights quantized into 128 x 128 blocks in both of the fp8 recipe's
// layouts in one kernel (kernels/weight_block_quantize.h). No Plan: the
// buffers say everything.
#pragma once

#include "ffi/handler_bundle.h"

namespace jax_cluster {

HandlerBundle weight_block_ffi_handlers();  // no instantiate stage

}  // namespace jax_cluster
