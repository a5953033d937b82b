// Decodes the buffers and the Plan of one "jax_cluster_gemm" call, checks
// every one of them, and launches the variant on XLA's stream. Anything wrong
// comes back as an ffi::Error naming the problem; nothing is launched then.
#include "ffi/gemm_ffi.h"

#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

#include "dispatch/gemm_dispatch.h"
#include "ffi/buffer_checks.h"
#include "ffi/launch.h"
#include "ffi/plan_attr.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_cluster {
namespace {

ffi::Error invalid(const std::string& msg) {
  return ffi::Error::InvalidArgument("jax_cluster_gemm: " + msg);
}

// Reads M, N, K and the batch from the buffers as the variant lays them out.
std::string problem_from_buffers(const VariantEntry& v, const ffi::AnyBuffer& a,
                                 const ffi::AnyBuffer& b, const ffi::AnyBuffer& d,
                                 GemmProblem* p) {
  auto da = a.dimensions(), db = b.dimensions(), dd = d.dimensions();
  size_t rank = da.size();
  if (rank < 2 || rank > 3 || db.size() != rank || dd.size() != rank)
    return "operands and result must all be rank 2 or all rank 3 (a leading batch)";
  int64_t batch = rank == 3 ? da[0] : 1;
  if (rank == 3 && (db[0] != batch || dd[0] != batch))
    return "batch sizes of A, B and the result differ";
  int64_t a0 = da[rank - 2], a1 = da[rank - 1], b0 = db[rank - 2], b1 = db[rank - 1];
  int64_t m = v.a_major == 'k' ? a0 : a1, ka = v.a_major == 'k' ? a1 : a0;
  int64_t n = v.b_major == 'k' ? b0 : b1, kb = v.b_major == 'k' ? b1 : b0;
  if (ka != kb) return "contracting dimensions differ: A has " + std::to_string(ka) +
                       ", B has " + std::to_string(kb);
  if (dd[rank - 2] != m || dd[rank - 1] != n)
    return "result shape does not match [M, N] = [" + std::to_string(m) + ", " +
           std::to_string(n) + "]";
  const int64_t kMax = INT32_MAX;
  if (m > kMax || n > kMax || ka > kMax || batch > kMax)
    return "a dimension exceeds 2^31 - 1";
  // TMA reads every row at a 16-byte-aligned address.
  int64_t lead_a = v.a_major == 'k' ? ka : m, lead_b = v.b_major == 'k' ? ka : n;
  if (std::string err = check_tma_alignment(lead_a, lead_b, n, a, b, d); !err.empty()) return err;
  *p = GemmProblem{static_cast<int>(m), static_cast<int>(n), static_cast<int>(ka),
                   static_cast<int>(batch), a.untyped_data(), b.untyped_data(),
                   d.untyped_data()};
  return "";
}

ffi::Error gemm_impl(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b,
                     ffi::Result<ffi::AnyBuffer> d, ffi::Result<ffi::AnyBuffer> workspace,
                     Plan plan) {
  Dispatch dispatch;
  if (std::string err = resolve_plan(plan, &dispatch); !err.empty()) return invalid(err);
  const VariantEntry& v = *dispatch.variant;
  if (std::string(v.problem) != "dense")
    return invalid(std::string("variant ") + v.name + " is grouped: call jax_cluster_ragged_dot");
  if (std::string err = check_dtypes(v, a, b, *d); !err.empty()) return invalid(err);
  GemmProblem problem;
  if (std::string err = problem_from_buffers(v, a, b, *d, &problem); !err.empty())
    return invalid(err);
  if (problem.m == 0 || problem.n == 0 || problem.batch == 0) return ffi::Error::Success();
  if (problem.k == 0) {  // an empty sum: the result is zero
    if (cudaMemsetAsync(d->untyped_data(), 0, d->size_bytes(), stream) != cudaSuccess)
      return ffi::Error::Internal("jax_cluster_gemm: cudaMemsetAsync failed");
    return ffi::Error::Success();
  }
  return launch_variant("jax_cluster_gemm", plan, dispatch, problem, *d, *workspace, stream);
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
