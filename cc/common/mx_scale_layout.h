// Sizes of MXFP8 scale factors in CUTLASS's sm100 layout
// (Sm1xxBlockScaledConfig): one e8m0 byte per kMxScaleBlock values along K,
// in 512-byte atoms of 128 rows by 4 scale columns, so rows pad to 128 and
// K/32 to 4. primitives/mx_scales.py writes this layout, and
// tests/native/test_mx_scale_layout.py checks it against CuTe's. constexpr, so
// device code can call these too (the build passes --expt-relaxed-constexpr).
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/contract.h"  // kMxScaleBlock

namespace jax_cluster {

inline constexpr int64_t kMxAtomRows = 128, kMxAtomBlocks = 4;

// Bytes of one row of an [rows, K] operand's scales: K/32, padded to whole atoms.
constexpr int64_t mx_scale_row_bytes(int64_t k) {
  int64_t blocks = (k + kMxScaleBlock - 1) / kMxScaleBlock;
  return (blocks + kMxAtomBlocks - 1) / kMxAtomBlocks * kMxAtomBlocks;
}

constexpr int64_t mx_padded_rows(int64_t rows) {
  return (rows + kMxAtomRows - 1) / kMxAtomRows * kMxAtomRows;
}

// Bytes of an [rows, K] operand's scales.
constexpr int64_t mx_layout_size(int64_t rows, int64_t k) {
  return mx_padded_rows(rows) * mx_scale_row_bytes(k);
}

// Rows of a grouped A's scales, each group starting on a row tile: at most
// one partial tile per non-empty group beyond the rows' own tiles.
constexpr int64_t mx_grouped_scale_rows(int64_t rows, int64_t groups) {
  return mx_padded_rows(rows) + std::min(groups, rows) * kMxAtomRows;
}

}  // namespace jax_cluster
