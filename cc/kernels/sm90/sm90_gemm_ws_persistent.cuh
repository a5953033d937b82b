// sm90a dense GEMM: warp-specialized, cluster-persistent, on CUTLASS's sm90
// collectives (TMA + wgmma, multi-stage mbarrier pipeline).
//
// Contract
//   A: [M,K] (RowMajor, K-major) or [K,M] (ColumnMajor, M-major), packed.
//   B: [N,K] (ColumnMajor, K-major) or [K,N] (RowMajor, N-major), packed.
//   D: [M,N] row-major; fp32 accumulation. Plain rows have no C operand;
//   "swap_ab" rows run D^T = B^T·A^T for small M (template arguments in the
//   swapped problem's terms); "bias_act" rows compute
//   D = act(alpha*A·B + beta*C + bias[n]) in the epilogue.
//   Leading dimensions are 16-byte multiples (TMA): the planner guarantees
//   it, the FFI handler and can_implement re-check it.
// Sharing: a (CM x CN) cluster multicasts B tiles to the CTAs along M and A
//   tiles to the CTAs along N through TMA; pipeline barriers are cluster-scoped.
// Scheduling: persistent grid of the Plan's resident clusters. Cooperative
//   kernels use CUTLASS's stream-K scheduler, which runs data-parallel
//   (static, swizzled raster), split-K or stream-K as the Plan says, and
//   releases the next kernel after each CTA's last mainloop
//   (sm90_stream_k_release.cuh);
//   cooperative-dynamic kernels take tiles from a global work queue
//   (sm90_dynamic_tile_scheduler.cuh); ping-pong kernels are static only.
// Block-scaled rows: A [M,K] and B [N,K] in fp8 (both K-major, as fp8 wgmma
//   needs), with GemmProblem's scale_a and scale_b; K a multiple of 128.
#pragma once

#include "kernels/cutlass_universal_gemm.cuh"
#include "kernels/sm90/sm90_dynamic_tile_scheduler.cuh"
#include "kernels/sm90/sm90_stream_k_release.cuh"

namespace jax_cluster::sm90 {

struct Cooperative {
  using Mainloop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using Scheduler = StreamKRelease;
  using Operands = PlainOperands;
};

struct CooperativeDynamic {
  using Mainloop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using Scheduler = DynamicPersistentScheduler;
  using Operands = PlainOperands;
};

// fp8 A and B with float32 block scales (DeepSeek-V3's recipe): CUTLASS's
// blockwise-scaled cooperative mainloop, which scales each K block's wgmma
// partial sums in registers before adding them to the fp32 accumulators.
// Static persistent schedule: the mainloop loads B's scales from a fourth
// producer warp, whose tile loop in CUTLASS's kernel neither advances a
// dynamic scheduler's pipeline state nor counts among its consumers, so the
// work queue would hand that warp stale tiles.
struct CooperativeBlockwise {
  using Mainloop = cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise;
  using Epilogue = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using Scheduler = cutlass::gemm::PersistentScheduler;
  using Operands = BlockScaledOperands;
};

struct Pingpong {
  using Mainloop = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using Epilogue = cutlass::epilogue::TmaWarpSpecialized;
  using Scheduler = cutlass::gemm::PersistentScheduler;
  using Operands = PlainOperands;
};

// Row: the menu row's tag type (RowKernel in cutlass_universal_gemm.cuh).
template <class Row, class ElementAB, class ElementD, class LayoutA, class LayoutB, int TileM,
          int TileN, int TileK, int ClusterM, int ClusterN, int Stages, class Kind,
          class Epilogue = PlainEpilogue, bool SwapAB = false>
using GemmWsPersistent =
    CutlassUniversalGemm<Row, cutlass::arch::Sm90, ElementAB, ElementD, LayoutA, LayoutB,
                         cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::Int<TileK>>,
                         cute::Shape<cute::Int<ClusterM>, cute::Int<ClusterN>, cute::_1>, Stages,
                         typename Kind::Mainloop, typename Kind::Epilogue, typename Kind::Scheduler,
                         Epilogue, SwapAB, typename Kind::Operands>;

}  // namespace jax_cluster::sm90
