// sm100f dense GEMM: tcgen05 UMMA with TMEM accumulators, on CUTLASS's sm100
// collectives. Compiled and SASS-checked here; never run (no Blackwell).
//
// Contract: as the sm90 family (A [M,K]/[K,M], B [N,K]/[K,N], D [M,N]
//   row-major, packed, 16-byte leading dimensions, fp32 accumulation, and
//   the fused bias/activation/C epilogue on "bias_act" rows).
// Sharing: 2-SM variants issue cta_group::2 UMMA over a CTA pair and load
//   operands with 2-SM TMA multicast; 1-SM variants keep each MMA in one CTA.
// Scheduling: Clc uses CUTLASS's Cluster Launch Control scheduler (the
//   hardware hands out the next tile); Static strides a persistent grid.
// MXFP8 rows (TwoSmMx): A [M,K] and B [N,K] in e4m3, both K-major, with one
//   e8m0 scale per 32 values along K (GemmProblem's mx_scale_a/b, in
//   CUTLASS's sm100 scale-factor layout); the block-scaled UMMA applies the
//   scales, the 2-SM pair copies them from shared to tensor memory.
#pragma once

#include "kernels/cutlass_universal_gemm.cuh"

namespace jax_cluster::sm100 {

struct TwoSm {
  using Mainloop = cutlass::gemm::KernelTmaWarpSpecialized2SmSm100;
  using Epilogue = cutlass::epilogue::TmaWarpSpecialized2Sm;
  using Operands = PlainOperands;
};
struct OneSm {
  using Mainloop = cutlass::gemm::KernelTmaWarpSpecialized1SmSm100;
  using Epilogue = cutlass::epilogue::TmaWarpSpecialized1Sm;
  using Operands = PlainOperands;
};
struct TwoSmMx {
  using Mainloop = cutlass::gemm::KernelTmaWarpSpecialized2SmMxf8f6f4Sm100;
  using Epilogue = cutlass::epilogue::TmaWarpSpecialized2Sm;
  using Operands = MxScaledOperands;
};
struct Clc {
  using Scheduler = void;  // CUTLASS's default on sm100: Cluster Launch Control
};
struct Static {
  using Scheduler = cutlass::gemm::StaticPersistentScheduler;
};

// Row: the menu row's tag type (RowKernel in cutlass_universal_gemm.cuh).
template <class Row, class ElementAB, class ElementD, class LayoutA, class LayoutB, int MmaM,
          int MmaN, int MmaK, int ClusterM, int ClusterN, int Stages, class Cta, class Sched,
          class Epilogue = PlainEpilogue>
using GemmTcgen05Persistent =
    CutlassUniversalGemm<Row, cutlass::arch::Sm100, ElementAB, ElementD, LayoutA, LayoutB,
                         cute::Shape<cute::Int<MmaM>, cute::Int<MmaN>, cute::Int<MmaK>>,
                         cute::Shape<cute::Int<ClusterM>, cute::Int<ClusterN>, cute::_1>, Stages,
                         typename Cta::Mainloop, typename Cta::Epilogue, typename Sched::Scheduler,
                         Epilogue, false, typename Cta::Operands>;

}  // namespace jax_cluster::sm100
