// sm100f grouped GEMM for ragged_dot: CUTLASS's pointer-array kernel with
// 2-CTA tcgen05 UMMA (a 256-row MMA over a CTA pair, 2-SM TMA loads, per-group
// TMA descriptors rewritten on the device), scheduled by Cluster Launch
// Control over the tiles of all groups (sm100_clc_group_scheduler.cuh).
// The per-group arrays and tile_start are built on the device from
// group_sizes (ragged_groups.cuh); the host never sees the sizes.
// MXFP8 rows (GroupedMxGemm): the block-scaled UMMA over e4m3 A and B with
// e8m0 scales, one scale-factor pointer and layout per group: ragged_m
// (GroupedMxOperands in cutlass_grouped_gemm.cuh) and the weight gradient,
// ragged_k over block-aligned tokens (GroupedMxTokenOperands).
// Compiled and SASS-checked here; never run (no Blackwell).
//
// Contract, workspace and entry points: cutlass_grouped_gemm.cuh.
// Launch: one 2x1 cluster per cluster tile of an upper bound on the tile
//   count. hw_info.sm_count is set to the launched CTA count: CUTLASS sizes
//   and indexes its per-CTA descriptor copies by it (the only use it has on
//   the grouped path), so it is not an SM count here.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>

#include "common/gemm_problem.h"
#include "kernels/cutlass_grouped_gemm.cuh"
#include "kernels/sm100/sm100_clc_group_scheduler.cuh"

namespace jax_cluster::sm100 {

// CLC over a grid bounded on the host; cluster tiles are MmaM rows (both CTAs
// of the pair) by one MmaN column tile.
template <RaggedProblem Problem, int MmaM, int MmaN, int ClusterM>
struct ClcScheduling {
  using ProblemShape = RaggedClcShape;
  static constexpr Schedule kSchedule = Schedule::kClc;
  static constexpr bool kTileStart = true;

  struct Launch {
    int cluster_tile_m = MmaM, tiles_n = 0;
    int64_t bound_clusters = 0;  // upper bound on the cluster tiles of all groups
    // tile_start and CUTLASS's tile ids are int32; the grid is CTAs along x.
    bool fits() const { return bound_clusters <= INT32_MAX / ClusterM; }
  };

  // ragged_m: each non-empty group wastes less than one row tile, so
  // floor((M + min(G, M) * (MmaM - 1)) / MmaM) row tiles bound the sum.
  // ragged_k: every group with rows covers all of K' (GEMM m).
  static Launch launch(const GemmProblem& p) {
    Launch l;
    l.tiles_n = (p.n + MmaN - 1) / MmaN;
    int64_t row_tiles = Problem == RaggedProblem::kRaggedM
                            ? (int64_t(p.m) + std::min<int64_t>(p.batch, p.m) * (MmaM - 1)) / MmaM
                            : int64_t(p.batch) * ((int64_t(p.m) + MmaM - 1) / MmaM);
    l.bound_clusters = std::max<int64_t>(row_tiles * l.tiles_n, 1);  // a launch needs a cluster
    return l;
  }

  // Fails to compile unless CUTLASS picked ClcGroupScheduler (only it has these fields).
  template <class Args, class Arrays>
  static void configure(Args& args, const DeviceSlots&, const Arrays& arrays, const Launch& l) {
    args.hw_info.sm_count = static_cast<int>(ClusterM * l.bound_clusters);
    args.scheduler.tile_start = arrays.tile_start;
    args.scheduler.bound_clusters = static_cast<int32_t>(l.bound_clusters);
    args.scheduler.tiles_n = l.tiles_n;
  }
};

// A 2-SM grouped row over a 2x1 cluster on CLC scheduling: MainloopSchedule
// and Operands say how it reads A and B. Row: the menu row's tag type
// (RowKernel in cutlass_universal_gemm.cuh).
template <class Row, class MainloopSchedule, class Operands, class ElementAB, class ElementD,
          class LayoutA, class LayoutB, int MmaM, int MmaN, int MmaK, int Stages,
          RaggedProblem Problem>
using TwoSmGroupedGemm =
    CutlassGroupedGemm<Row, cutlass::arch::Sm100, ElementAB, ElementD, LayoutA, LayoutB,
                       cute::Shape<cute::Int<MmaM>, cute::Int<MmaN>, cute::Int<MmaK>>,
                       cute::Shape<cute::_2, cute::_1, cute::_1>, Stages, MainloopSchedule,
                       PlainGroupedEpilogue<cutlass::epilogue::PtrArrayTmaWarpSpecialized2Sm>,
                       Problem, ClcScheduling<Problem, MmaM, MmaN, /*ClusterM=*/2>, Operands>;

template <class Row, class ElementAB, class ElementD, class LayoutA, class LayoutB, int MmaM,
          int MmaN, int MmaK, int Stages, RaggedProblem Problem>
using GroupedGemm = TwoSmGroupedGemm<Row, cutlass::gemm::KernelPtrArrayTmaWarpSpecialized2SmSm100,
                                     GroupedPlainOperands, ElementAB, ElementD, LayoutA, LayoutB,
                                     MmaM, MmaN, MmaK, Stages, Problem>;

template <class Row, class ElementAB, class ElementD, class LayoutA, class LayoutB, int MmaM,
          int MmaN, int MmaK, int Stages, RaggedProblem Problem>
using GroupedMxGemm =
    TwoSmGroupedGemm<Row, cutlass::gemm::KernelPtrArrayTmaWarpSpecialized2SmMxf8f6f4Sm100,
                     std::conditional_t<Problem == RaggedProblem::kRaggedM, GroupedMxOperands,
                                        GroupedMxTokenOperands>,
                     ElementAB, ElementD, LayoutA, LayoutB, MmaM, MmaN, MmaK, Stages, Problem>;

}  // namespace jax_cluster::sm100
