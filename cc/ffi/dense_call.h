// The parts of a dense GEMM call both dense handlers share: the variant check
// made once per call site, and the buffer checks made on every call. Each
// returns "" on success, else what is wrong.
#pragma once

#include <string>

#include "common/gemm_problem.h"
#include "dispatch/variant_table.h"
#include "xla/ffi/api/ffi.h"

namespace jax_cluster {

// Whether the variant reads fp8 operands with float32 block scales.
bool block_scaled(const VariantEntry& v);

// `epilogue` is the menu epilogue the calling handler serves ("none" or
// "bias_act") and `scaled` whether it passes block scales; a variant that
// differs in either, or a grouped one, is refused.
std::string check_dense_variant(const VariantEntry& v, const char* epilogue, bool scaled = false);

// Checks A, B and D against the variant and describes the launch.
std::string dense_problem(const VariantEntry& v, const xla::ffi::AnyBuffer& a,
                          const xla::ffi::AnyBuffer& b, const xla::ffi::AnyBuffer& d,
                          GemmProblem* problem);

}  // namespace jax_cluster
