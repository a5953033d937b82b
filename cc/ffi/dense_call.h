// The part of a dense GEMM call both dense handlers share: resolve the Plan
// against the menu, check A, B and D against the variant, and describe the
// launch. Returns "" on success, else what is wrong.
#pragma once

#include <string>

#include "common/gemm_problem.h"
#include "common/plan.h"
#include "dispatch/gemm_dispatch.h"
#include "xla/ffi/api/ffi.h"

namespace jax_cluster {

// `epilogue` is the menu epilogue the calling handler serves ("none" or
// "bias_act"); a Plan naming a variant with another one is refused.
std::string decode_dense_call(const Plan& plan, const char* epilogue, const xla::ffi::AnyBuffer& a,
                              const xla::ffi::AnyBuffer& b, const xla::ffi::AnyBuffer& d,
                              Dispatch* dispatch, GemmProblem* problem);

}  // namespace jax_cluster
