// The handlers of one FFI target: the instantiate stage, which resolves the
// Plan once per call site (ffi/plan_state.h), and two execute handlers that
// differ only in whether XLA may trace them into its command buffers.
#pragma once

#include "xla/ffi/api/c_api.h"

namespace jax_cluster {

struct HandlerBundle {
  XLA_FFI_Handler* instantiate;             // null for a target without a Plan
  XLA_FFI_Handler* execute;                 // command-buffer compatible
  XLA_FFI_Handler* execute_outside_graphs;  // run as its own thunk, never traced
};

}  // namespace jax_cluster
