// The dense GEMM call (kGemmTarget). The instantiate stage resolves the Plan
// once per call site; each call checks A, B and D against the variant and
// launches it on XLA's stream. Anything wrong comes back as an ffi::Error
// naming the problem; nothing is launched then.
#include "ffi/gemm_ffi.h"

#include <memory>
#include <string>
#include <utility>

#include <cuda_runtime_api.h>

#include "common/contract.h"
#include "ffi/dense_call.h"
#include "ffi/launch.h"
#include "ffi/plan_attr.h"
#include "ffi/plan_state.h"
#include "ffi/record_stage.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_cluster {
namespace {

ffi::Error invalid(const std::string& msg) {
  return ffi::Error::InvalidArgument(std::string(kGemmTarget) + ": " + msg);
}

PlanStateOr gemm_instantiate(Plan plan) {
  std::unique_ptr<PlanState> state = PlanState::resolve(plan);
  if (state->error().empty()) state->refuse(check_dense_variant(state->variant(), "none"));
  return state;
}

ffi::Error gemm_execute(PlanState* state, cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b,
                        ffi::Result<ffi::AnyBuffer> d, ffi::Result<ffi::AnyBuffer> workspace) {
  if (!state->error().empty()) return invalid(state->error());
  GemmProblem problem;
  if (std::string err = dense_problem(state->variant(), a, b, *d, &problem); !err.empty())
    return invalid(err);
  if (problem.m == 0 || problem.n == 0 || problem.batch == 0) return ffi::Error::Success();
  if (problem.k == 0) return zero_output(kGemmTarget, *d, stream);
  return launch_variant(kGemmTarget, *state, problem, *d, *workspace, stream);
}

// The call's buffers (A, B; D and the workspace), after either stage's contexts.
template <class Binding>
auto with_buffers(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>();
}

ffi::Error gemm_record(RecordContext ctx, PlanState* state, cudaStream_t stream, ffi::AnyBuffer a,
                       ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> d,
                       ffi::Result<ffi::AnyBuffer> workspace) {
  GemmProblem problem;
  if (state->error().empty() && dense_problem(state->variant(), a, b, *d, &problem).empty())
    return record_launch(kGemmTarget, ctx, *state, problem, *d, *workspace, stream);
  return ctx.RequestStreamCapture();  // the traced execute handler reports the error
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(GemmInstantiate, gemm_instantiate,
                              ffi::Ffi::BindInstantiate().Attr<Plan>("plan"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(GemmExecute, gemm_execute, with_buffers(bind_execute()),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(GemmExecuteOutsideGraphs, gemm_execute, with_buffers(bind_execute()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(GemmRecord, gemm_record, with_buffers(bind_record()));

HandlerBundle gemm_ffi_handlers() {
  return {GemmInstantiate, GemmExecute, GemmExecuteOutsideGraphs, GemmRecord};
}

}  // namespace jax_cluster
