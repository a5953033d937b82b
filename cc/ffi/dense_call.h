// The parts of a dense GEMM call both dense handlers share: the variant check
// made once per call site, and the buffer checks made on every call. Each
// returns "" on success, else what is wrong.
#pragma once

#include <string>

#include "common/gemm_problem.h"
#include "dispatch/variant_table.h"
#include "xla/ffi/api/ffi.h"

namespace jax_cluster {

// `epilogue` is the menu epilogue the calling handler serves ("none" or
// "bias_act"); a variant with another one, or a grouped one, is refused.
std::string check_dense_variant(const VariantEntry& v, const char* epilogue);

// Checks A, B and D against the variant and describes the launch.
std::string dense_problem(const VariantEntry& v, const xla::ffi::AnyBuffer& a,
                          const xla::ffi::AnyBuffer& b, const xla::ffi::AnyBuffer& d,
                          GemmProblem* problem);

}  // namespace jax_cluster
