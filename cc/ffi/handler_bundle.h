// The handlers of one FFI target: the instantiate stage, which resolves the
// Plan once per call site (ffi/plan_state.h), two execute handlers that
// differ only in whether XLA may trace them into its command buffers, and,
// for targets that have one, the record stage (ffi/record_stage.h).
#pragma once

#include "xla/ffi/api/c_api.h"

namespace jax_cluster {

struct HandlerBundle {
  XLA_FFI_Handler* instantiate;             // null for a target without a Plan
  XLA_FFI_Handler* execute;                 // command-buffer compatible
  XLA_FFI_Handler* execute_outside_graphs;  // run as its own thunk, never traced
  XLA_FFI_Handler* record = nullptr;        // adds its kernel to XLA's command buffer
};

}  // namespace jax_cluster
