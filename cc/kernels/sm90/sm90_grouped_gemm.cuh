// sm90a grouped GEMM for ragged_dot: CUTLASS's pointer-array cooperative
// kernel (TMA + wgmma; per-group TMA descriptors rewritten on the device),
// scheduled dynamically over the tiles of all groups
// (sm90_dynamic_group_scheduler.cuh), with the per-group arrays built on the
// device from group_sizes (ragged_groups.cuh). No host round trip.
//
// Contract, workspace and entry points: cutlass_grouped_gemm.cuh. The work
// queue's clusters are 1x1 over a persistent grid of the device's SMs; the
// static rows (GroupedStaticGemm) run 2-CTA clusters on CUTLASS's scheduler.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/gemm/kernel/tile_scheduler.hpp>

#include "common/gemm_problem.h"
#include "kernels/cutlass_grouped_gemm.cuh"
#include "kernels/sm90/sm90_dynamic_group_scheduler.cuh"
#include "kernels/sm90/sm90_gated_epilogue.cuh"

namespace jax_cluster::sm90 {

// A persistent grid over the device's SMs; nothing to add but CUTLASS's
// raster. ProblemShape picks CUTLASS's scheduler: RaggedProblemShape the work
// queue (sm90_dynamic_group_scheduler.cuh, 1x1 clusters); the plain group
// shape CUTLASS's own static group scheduler, a fixed grid stride through
// the groups' cluster tiles. That one runs clusters: a cluster's CTAs take
// neighbouring tiles of one group, so along N (ragged_m) they share the
// group's rows, multicast A and waste nothing at group edges; along M they
// share B, and ragged_k's M (K') is not ragged.
template <class Shape, Schedule S>
struct PersistentGroupScheduling {
  using ProblemShape = Shape;
  static constexpr Schedule kSchedule = S;
  static constexpr bool kTileStart = false;
  struct Launch {
    int cluster_tile_m = 1, tiles_n = 0;  // no tile_start to build
    bool fits() const { return true; }
  };
  static Launch launch(const GemmProblem&) { return {}; }
  template <class Args, class Arrays>
  static void configure(Args& args, const DeviceSlots&, const Arrays&, const Launch&) {
    args.scheduler.raster_order = cutlass::gemm::kernel::detail::RasterOrderOptions::AlongM;
    args.scheduler.max_swizzle_size = 1;
  }
};

using WorkQueueScheduling = PersistentGroupScheduling<RaggedProblemShape, Schedule::kDynamic>;
using StaticGroupScheduling =
    PersistentGroupScheduling<cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>,
                              Schedule::kStatic>;

using CooperativeEpilogue =
    PlainGroupedEpilogue<cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;

// The bf16/fp16 rows: CUTLASS's cooperative pointer-array kernel. Row: the
// menu row's tag type (RowKernel in cutlass_universal_gemm.cuh).
template <class Row, class ElementAB, class ElementD, class LayoutA, class LayoutB, int TileM,
          int TileN, int TileK, int ClusterM, int ClusterN, int Stages, RaggedProblem Problem,
          class Scheduling, class Epilogue = CooperativeEpilogue>
using CooperativeGroupedGemm =
    CutlassGroupedGemm<Row, cutlass::arch::Sm90, ElementAB, ElementD, LayoutA, LayoutB,
                       cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::Int<TileK>>,
                       cute::Shape<cute::Int<ClusterM>, cute::Int<ClusterN>, cute::_1>, Stages,
                       cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative, Epilogue,
                       Problem, Scheduling>;

template <class Row, class ElementAB, class ElementD, class LayoutA, class LayoutB, int TileM,
          int TileN, int TileK, int ClusterM, int ClusterN, int Stages, RaggedProblem Problem>
using GroupedStaticGemm =
    CooperativeGroupedGemm<Row, ElementAB, ElementD, LayoutA, LayoutB, TileM, TileN, TileK,
                           ClusterM, ClusterN, Stages, Problem, StaticGroupScheduling>;

template <class Row, class ElementAB, class ElementD, class LayoutA, class LayoutB, int TileM,
          int TileN, int TileK, int Stages, RaggedProblem Problem>
using GroupedGemm = CooperativeGroupedGemm<Row, ElementAB, ElementD, LayoutA, LayoutB, TileM, TileN,
                                           TileK, 1, 1, Stages, Problem, WorkQueueScheduling>;

// The gated rows: the work-queue kernel whose epilogue writes act(gate) * up
// (sm90_gated_epilogue.cuh) straight from the accumulators.
template <class Row, class ElementAB, class ElementD, class LayoutA, class LayoutB, int TileM,
          int TileN, int TileK, int Stages, RaggedProblem Problem>
using GroupedGatedGemm =
    CooperativeGroupedGemm<Row, ElementAB, ElementD, LayoutA, LayoutB, TileM, TileN, TileK, 1, 1,
                           Stages, Problem, WorkQueueScheduling, GatedGroupedEpilogue>;

// fp8 with float32 block scales: CUTLASS's blockwise-scaled array mainloop on
// the same work queue, ragged_m (the forward, d_input) with 128x128 weight
// blocks, ragged_k (d_weight) with both operands in token tiles. Its
// auxiliary scale-load warp counts among the scheduler pipeline's consumers
// in CUTLASS's array kernel, unlike the dense kernel's
// (sm90_gemm_ws_persistent.cuh).
template <class Row, class ElementAB, class ElementD, class LayoutA, class LayoutB, int TileM,
          int TileN, int TileK, int Stages, RaggedProblem Problem>
using GroupedBlockwiseGemm =
    CutlassGroupedGemm<Row, cutlass::arch::Sm90, ElementAB, ElementD, LayoutA, LayoutB,
                       cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::Int<TileK>>,
                       cute::Shape<cute::_1, cute::_1, cute::_1>, Stages,
                       cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise,
                       CooperativeEpilogue, Problem, WorkQueueScheduling,
                       std::conditional_t<Problem == RaggedProblem::kRaggedM,
                                          GroupedBlockScaledOperands, GroupedTokenScaledOperands>>;

}  // namespace jax_cluster::sm90
