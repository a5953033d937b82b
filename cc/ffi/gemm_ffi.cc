// Decodes the buffers and the Plan of one dense GEMM call (kGemmTarget), checks
// every one of them, and launches the variant on XLA's stream. Anything wrong
// comes back as an ffi::Error naming the problem; nothing is launched then.
#include "ffi/gemm_ffi.h"

#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

#include "common/contract.h"
#include "dispatch/gemm_dispatch.h"
#include "ffi/dense_call.h"
#include "ffi/launch.h"
#include "ffi/plan_attr.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_cluster {
namespace {

ffi::Error invalid(const std::string& msg) {
  return ffi::Error::InvalidArgument(std::string(kGemmTarget) + ": " + msg);
}

ffi::Error gemm_impl(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b,
                     ffi::Result<ffi::AnyBuffer> d, ffi::Result<ffi::AnyBuffer> workspace,
                     Plan plan) {
  Dispatch dispatch;
  GemmProblem problem;
  if (std::string err = decode_dense_call(plan, "none", a, b, *d, &dispatch, &problem);
      !err.empty())
    return invalid(err);
  if (problem.m == 0 || problem.n == 0 || problem.batch == 0) return ffi::Error::Success();
  if (problem.k == 0) return zero_output(kGemmTarget, *d, stream);
  return launch_variant(kGemmTarget, plan, dispatch, problem, *d, *workspace, stream);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(GemmFfi, gemm_impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<Plan>("plan"),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_Handler* gemm_ffi_handler() { return GemmFfi; }

}  // namespace jax_cluster
