// The block-scaled fp8 GEMM call (kScaledGemmTarget): A [M,K] and B [N,K] in
// fp8, scale_a [K/128, M] (A's 1x128 tiles) and scale_b [K/128, ceil(N/128)]
// (B's 128x128 blocks) in float32, K-block-major; D [M,N]. MX variants
// (kMxDtype) take e8m0 scales instead, one per 32 values along K of A and B,
// flat in CUTLASS's sm100 scale-factor layout (primitives/mx_scales.py). The instantiate
// stage resolves the Plan once per call site; each call checks the buffers
// and launches on XLA's stream, or returns an ffi::Error naming the problem.
#include "ffi/scaled_gemm_ffi.h"

#include <memory>
#include <string>

#include <cuda_runtime_api.h>

#include "common/contract.h"
#include "ffi/buffer_checks.h"
#include "ffi/dense_call.h"
#include "ffi/launch.h"
#include "ffi/mx_scale_checks.h"
#include "ffi/plan_attr.h"
#include "ffi/plan_state.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_cluster {
namespace {

ffi::Error invalid(const std::string& msg) {
  return ffi::Error::InvalidArgument(std::string(kScaledGemmTarget) + ": " + msg);
}

// "" when `scale` is float32 [rows, cols], else what is wrong with it.
std::string check_scale(const char* label, const ffi::AnyBuffer& scale, int64_t rows,
                        int64_t cols) {
  auto dims = scale.dimensions();
  if (scale.element_type() != ffi::DataType::F32)
    return std::string(label) + " must be float32, got " + dtype_name(scale.element_type());
  if (dims.size() != 2 || dims[0] != rows || dims[1] != cols)
    return std::string(label) + " must be [" + std::to_string(rows) + ", " + std::to_string(cols) +
           "] (K/" + std::to_string(kScaleBlock) + " blocks first)";
  if (!aligned16(scale.untyped_data())) return std::string(label) + " must be 16-byte aligned";
  return "";
}

std::string mx_problem(const ffi::AnyBuffer& scale_a, const ffi::AnyBuffer& scale_b,
                       GemmProblem* p) {
  if (std::string err = check_mx_scale("scale_a", scale_a, {mx_layout_size(p->m, p->k)});
      !err.empty())
    return err;
  if (std::string err = check_mx_scale("scale_b", scale_b, {mx_layout_size(p->n, p->k)});
      !err.empty())
    return err;
  p->mx_scale_a = scale_a.untyped_data();
  p->mx_scale_b = scale_b.untyped_data();
  return "";
}

std::string scaled_problem(const VariantEntry& v, const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                           const ffi::AnyBuffer& scale_a, const ffi::AnyBuffer& scale_b,
                           const ffi::AnyBuffer& d, GemmProblem* p) {
  if (std::string err = dense_problem(v, a, b, d, p); !err.empty()) return err;
  if (p->batch != 1) return "operands must be rank 2 (no batch)";
  // the MX kernel's K tile is kScaleBlock deep too
  if (v.dtype == kMxDtype && p->k % kScaleBlock == 0) return mx_problem(scale_a, scale_b, p);
  if (p->k % kScaleBlock)
    return "K = " + std::to_string(p->k) + " is not a multiple of the scale block " +
           std::to_string(kScaleBlock);
  // the kernel reads A's scales with TMA, whose row pitch must be 16 bytes
  if (p->m % 4) return "M = " + std::to_string(p->m) + " is not a multiple of 4";
  int64_t k_blocks = p->k / kScaleBlock, n_blocks = (p->n + kScaleBlock - 1) / kScaleBlock;
  if (std::string err = check_scale("scale_a", scale_a, k_blocks, p->m); !err.empty()) return err;
  if (std::string err = check_scale("scale_b", scale_b, k_blocks, n_blocks); !err.empty())
    return err;
  p->scale_a = static_cast<const float*>(scale_a.untyped_data());
  p->scale_b = static_cast<const float*>(scale_b.untyped_data());
  return "";
}

PlanStateOr scaled_gemm_instantiate(Plan plan) {
  std::unique_ptr<PlanState> state = PlanState::resolve(plan);
  if (state->error().empty()) state->refuse(check_dense_variant(state->variant(), "none", true));
  return state;
}

ffi::Error scaled_gemm_execute(PlanState* state, cudaStream_t stream, ffi::AnyBuffer a,
                               ffi::AnyBuffer b, ffi::AnyBuffer scale_a, ffi::AnyBuffer scale_b,
                               ffi::Result<ffi::AnyBuffer> d,
                               ffi::Result<ffi::AnyBuffer> workspace) {
  if (!state->error().empty()) return invalid(state->error());
  GemmProblem problem;
  if (std::string err = scaled_problem(state->variant(), a, b, scale_a, scale_b, *d, &problem);
      !err.empty())
    return invalid(err);
  if (problem.m == 0 || problem.n == 0) return ffi::Error::Success();
  if (problem.k == 0) return zero_output(kScaledGemmTarget, *d, stream);
  return launch_variant(kScaledGemmTarget, *state, problem, *d, *workspace, stream);
}

auto execute_binding() {
  return bind_execute()
      .Arg<ffi::AnyBuffer>()
      .Arg<ffi::AnyBuffer>()
      .Arg<ffi::AnyBuffer>()
      .Arg<ffi::AnyBuffer>()
      .Ret<ffi::AnyBuffer>()
      .Ret<ffi::AnyBuffer>();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ScaledGemmInstantiate, scaled_gemm_instantiate,
                              ffi::Ffi::BindInstantiate().Attr<Plan>("plan"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(ScaledGemmExecute, scaled_gemm_execute, execute_binding(),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(ScaledGemmExecuteOutsideGraphs, scaled_gemm_execute,
                              execute_binding());

HandlerBundle scaled_gemm_ffi_handlers() {
  return {ScaledGemmInstantiate, ScaledGemmExecute, ScaledGemmExecuteOutsideGraphs};
}

}  // namespace jax_cluster
