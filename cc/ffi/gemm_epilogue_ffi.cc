// The fused-epilogue target (kGemmEpilogueTarget): A and B as for the plain
// GEMM, then bias ([N], or empty for none) and C (D's shape, or empty for
// none), all in D's dtype. The Plan and the scalars alpha, beta and the
// activation are decoded once per call site (instantiate stage). Everything is
// checked before anything is launched.
#include "ffi/gemm_epilogue_ffi.h"

#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <utility>

#include <cuda_runtime_api.h>

#include "common/contract.h"
#include "ffi/buffer_checks.h"
#include "ffi/dense_call.h"
#include "ffi/launch.h"
#include "ffi/plan_attr.h"
#include "ffi/plan_state.h"
#include "ffi/record_stage.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_cluster {
namespace {

constexpr const char* kTarget = kGemmEpilogueTarget;

ffi::Error invalid(const std::string& msg) {
  return ffi::Error::InvalidArgument(std::string(kTarget) + ": " + msg);
}

// "" when the activation code is one the contract names; fills the scalars.
std::string epilogue_scalars(float alpha, float beta, int32_t activation, EpilogueArgs* e) {
  e->alpha = alpha;
  e->beta = beta;
  return activation_from_attr(activation, &e->activation);
}

// "" when bias and C fit D; fills the buffers of the epilogue of `p`.
std::string epilogue_buffers(const ffi::AnyBuffer& bias, const ffi::AnyBuffer& c,
                             const ffi::AnyBuffer& d, GemmProblem* p) {
  EpilogueArgs& e = p->epilogue;
  if (bias.element_count() > 0) {
    auto dims = bias.dimensions();
    if (dims.size() != 1 || dims[0] != p->n)
      return "bias must be [N] = [" + std::to_string(p->n) + "]";
    if (bias.element_type() != d.element_type()) return "bias must have the output's dtype";
    if (!aligned16(bias.untyped_data())) return "bias must be 16-byte aligned";
    e.bias = bias.untyped_data();
  }
  if (c.element_count() > 0) {
    auto dc = c.dimensions(), dd = d.dimensions();
    if (dc.size() != dd.size()) return "C must have the result's shape";
    for (size_t i = 0; i < dc.size(); ++i)
      if (dc[i] != dd[i]) return "C must have the result's shape";
    if (c.element_type() != d.element_type()) return "C must have the output's dtype";
    if (!aligned16(c.untyped_data())) return "C must be 16-byte aligned";
    e.c = c.untyped_data();
  }
  if (e.beta != 0.0f && e.c == nullptr) return "beta is not 0 but C is missing";
  return "";
}

PlanStateOr gemm_epilogue_instantiate(Plan plan, float alpha, float beta, int32_t activation) {
  std::unique_ptr<PlanState> state = PlanState::resolve(plan);
  if (state->error().empty()) state->refuse(check_dense_variant(state->variant(), "bias_act"));
  state->refuse(epilogue_scalars(alpha, beta, activation, &state->epilogue));
  return state;
}

// The call's GEMM view with its epilogue; an error names what is wrong.
ffi::Error epilogue_problem(const PlanState& state, const ffi::AnyBuffer& a,
                            const ffi::AnyBuffer& b, const ffi::AnyBuffer& bias,
                            const ffi::AnyBuffer& c, const ffi::AnyBuffer& d,
                            GemmProblem* problem) {
  if (!state.error().empty()) return invalid(state.error());
  if (std::string err = dense_problem(state.variant(), a, b, d, problem); !err.empty())
    return invalid(err);
  problem->epilogue = state.epilogue;
  if (std::string err = epilogue_buffers(bias, c, d, problem); !err.empty()) return invalid(err);
  return ffi::Error::Success();
}

ffi::Error gemm_epilogue_execute(PlanState* state, cudaStream_t stream, ffi::AnyBuffer a,
                                 ffi::AnyBuffer b, ffi::AnyBuffer bias, ffi::AnyBuffer c,
                                 ffi::Result<ffi::AnyBuffer> d,
                                 ffi::Result<ffi::AnyBuffer> workspace) {
  GemmProblem problem;
  if (ffi::Error err = epilogue_problem(*state, a, b, bias, c, *d, &problem); err.failure())
    return err;
  if (problem.m == 0 || problem.n == 0 || problem.batch == 0) return ffi::Error::Success();
  // act(bias + beta*C) is not a memset: the planner sends K = 0 to XLA.
  if (problem.k == 0) return invalid("K = 0 has no kernel plan; it runs on XLA");
  return launch_variant(kTarget, *state, problem, *d, *workspace, stream);
}

ffi::Error gemm_epilogue_record(RecordContext ctx, PlanState* state, cudaStream_t stream,
                                ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::AnyBuffer bias,
                                ffi::AnyBuffer c, ffi::Result<ffi::AnyBuffer> d,
                                ffi::Result<ffi::AnyBuffer> workspace) {
  GemmProblem problem;
  if (epilogue_problem(*state, a, b, bias, c, *d, &problem).failure())
    return ctx.RequestStreamCapture();  // the traced execute handler reports the error
  return record_launch(kTarget, ctx, *state, problem, *d, *workspace, stream);
}

// The call's buffers (A, B, bias, C; D and the workspace), after either stage's contexts.
template <class Binding>
auto with_buffers(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(GemmEpilogueInstantiate, gemm_epilogue_instantiate,
                              ffi::Ffi::BindInstantiate()
                                  .Attr<Plan>("plan")
                                  .Attr<float>("alpha")
                                  .Attr<float>("beta")
                                  .Attr<int32_t>("activation"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(GemmEpilogueExecute, gemm_epilogue_execute,
                              with_buffers(bind_execute()), {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(GemmEpilogueExecuteOutsideGraphs, gemm_epilogue_execute,
                              with_buffers(bind_execute()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(GemmEpilogueRecord, gemm_epilogue_record,
                              with_buffers(bind_record()));

HandlerBundle gemm_epilogue_ffi_handlers() {
  return {GemmEpilogueInstantiate, GemmEpilogueExecute, GemmEpilogueExecuteOutsideGraphs,
          GemmEpilogueRecord};
}

}  // namespace jax_cluster
