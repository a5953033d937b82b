// Checks the dense operands of a call against the menu row its Plan names.
#include "ffi/dense_call.h"

#include <cstdint>

#include "common/contract.h"
#include "ffi/buffer_checks.h"

namespace jax_cluster {
namespace {

// Reads M, N, K and the batch from the buffers as the variant lays them out.
std::string problem_from_buffers(const VariantEntry& v, const xla::ffi::AnyBuffer& a,
                                 const xla::ffi::AnyBuffer& b, const xla::ffi::AnyBuffer& d,
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
  if (ka != kb)
    return "contracting dimensions differ: A has " + std::to_string(ka) + ", B has " +
           std::to_string(kb);
  if (dd[rank - 2] != m || dd[rank - 1] != n)
    return "result shape does not match [M, N] = [" + std::to_string(m) + ", " + std::to_string(n) +
           "]";
  const int64_t kMax = INT32_MAX;
  if (m > kMax || n > kMax || ka > kMax || batch > kMax) return "a dimension exceeds 2^31 - 1";
  // TMA reads every row at a 16-byte-aligned address.
  int64_t lead_a = v.a_major == 'k' ? ka : m, lead_b = v.b_major == 'k' ? ka : n;
  if (std::string err = check_tma_alignment(lead_a, lead_b, n, a, b, d); !err.empty()) return err;
  *p = GemmProblem{static_cast<int>(m),     static_cast<int>(n), static_cast<int>(ka),
                   static_cast<int>(batch), a.untyped_data(),    b.untyped_data(),
                   d.untyped_data()};
  return "";
}

}  // namespace

bool block_scaled(const VariantEntry& v) {
  return index_of(kBlockScaledDtypes, std::string_view(v.dtype)) >= 0;
}

std::string check_dense_variant(const VariantEntry& v, const char* epilogue, bool scaled) {
  if (std::string(v.problem) != "dense")
    return std::string("variant ") + v.name + " is grouped: call " +
           (scaled ? kScaledRaggedDotTarget : kRaggedDotTarget);
  if (block_scaled(v) != scaled)
    return std::string("variant ") + v.name +
           (scaled ? " is not block-scaled: call " + std::string(kGemmTarget)
                   : " is block-scaled: call " + std::string(kScaledGemmTarget));
  if (std::string(v.epilogue) != epilogue)
    return std::string("variant ") + v.name + " has epilogue '" + v.epilogue +
           "', this call needs '" + epilogue + "'";
  return "";
}

std::string dense_problem(const VariantEntry& v, const xla::ffi::AnyBuffer& a,
                          const xla::ffi::AnyBuffer& b, const xla::ffi::AnyBuffer& d,
                          GemmProblem* problem) {
  if (std::string err = check_dtypes(v, a, b, d); !err.empty()) return err;
  return problem_from_buffers(v, a, b, d, problem);
}

}  // namespace jax_cluster
