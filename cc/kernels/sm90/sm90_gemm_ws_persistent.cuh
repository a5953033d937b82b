// sm90a dense GEMM: warp-specialized, cluster-persistent, built on CUTLASS 3.x.
//
// Contract
//   A: [M,K] (RowMajor, K-major) or [K,M] (ColumnMajor, M-major), packed.
//   B: [N,K] (ColumnMajor, K-major) or [K,N] (RowMajor, N-major), packed.
//   D: [M,N] row-major; fp32 accumulation; no source operand (beta = 0).
//   All leading dimensions must be 16-byte multiples (TMA); the planner
//   guarantees this and can_implement re-checks it.
// Sharing: a (CM x CN) cluster multicasts A tiles along N and B tiles along M
//   through TMA; mbarriers are cluster-scoped.
// Scheduling: persistent grid sized from cudaOccupancyMaxActiveClusters; the
//   cooperative kernels use CUTLASS's stream-K scheduler, which runs data
//   parallel (static, swizzled raster), split-K or stream-K as the Plan says.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/gemm/kernel/tile_scheduler.hpp>
#include <cutlass/util/packed_stride.hpp>

#include "common/gemm_problem.h"
#include "kernels/launch_common.cuh"

namespace jax_cluster::sm90 {

struct Cooperative {
  using Mainloop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using Scheduler = cutlass::gemm::StreamKScheduler;
};

struct Pingpong {
  using Mainloop = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using Epilogue = cutlass::epilogue::TmaWarpSpecialized;
  using Scheduler = cutlass::gemm::PersistentScheduler;
};

template <class ElementAB, class ElementD, class LayoutA, class LayoutB,
          int TileM, int TileN, int TileK, int ClusterM, int ClusterN,
          int Stages, class Kind>
struct GemmWsPersistent {
  using TileShape = cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::Int<TileK>>;
  using ClusterShape = cute::Shape<cute::Int<ClusterM>, cute::Int<ClusterN>, cute::_1>;
  static constexpr int kAlignAB = 16 / sizeof(ElementAB);
  static constexpr int kAlignD = 16 / sizeof(ElementD);

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, cutlass::layout::RowMajor, kAlignD,
      ElementD, cutlass::layout::RowMajor, kAlignD,
      typename Kind::Epilogue>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      ElementAB, LayoutA, kAlignAB, ElementAB, LayoutB, kAlignAB, float,
      TileShape, ClusterShape, cutlass::gemm::collective::StageCount<Stages>,
      typename Kind::Mainloop>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<
      cute::Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue,
      typename Kind::Scheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static_assert(Kernel::SharedStorageSize <= 227 * 1024,
                "variant does not fit in sm90 shared memory: lower its stages");
  static constexpr bool kHasStreamK =
      std::is_same_v<typename Kind::Scheduler, cutlass::gemm::StreamKScheduler>;

  static typename Gemm::Arguments arguments(const GemmProblem& p,
                                            const LaunchChoices& c,
                                            const DeviceSlots& s) {
    using namespace cute;
    auto sa = cutlass::make_cute_packed_stride(typename Kernel::StrideA{},
                                               make_shape(p.m, p.k, p.batch));
    auto sb = cutlass::make_cute_packed_stride(typename Kernel::StrideB{},
                                               make_shape(p.n, p.k, p.batch));
    auto sd = cutlass::make_cute_packed_stride(typename Kernel::StrideD{},
                                               make_shape(p.m, p.n, p.batch));
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {p.m, p.n, p.k, p.batch},
        {static_cast<const ElementAB*>(p.a), sa, static_cast<const ElementAB*>(p.b), sb},
        {{}, nullptr, sd, static_cast<ElementD*>(p.d), sd}};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    args.hw_info.device_id = s.device_id;
    args.hw_info.sm_count = s.sm_count;
    args.hw_info.max_active_clusters = s.max_active_clusters;
    args.scheduler.max_swizzle_size = c.swizzle;
    args.scheduler.raster_order = c.raster == Raster::kAlongM
                                      ? cutlass::gemm::kernel::detail::RasterOrderOptions::AlongM
                                      : cutlass::gemm::kernel::detail::RasterOrderOptions::AlongN;
    if constexpr (kHasStreamK) {
      using Mode = cutlass::gemm::kernel::detail::DecompositionMode;
      args.scheduler.reduction_mode =
          cutlass::gemm::kernel::detail::ReductionMode::Deterministic;
      args.scheduler.splits = c.schedule == Schedule::kSplitK ? c.splits : 1;
      args.scheduler.decomposition_mode = c.schedule == Schedule::kStreamK ? Mode::StreamK
                                          : c.schedule == Schedule::kSplitK ? Mode::SplitK
                                                                            : Mode::DataParallel;
    }
    return args;
  }

  static size_t workspace_size(const GemmProblem& p, const LaunchChoices& c,
                               const DeviceSlots& s) {
    return Gemm::get_workspace_size(arguments(p, c, s));
  }

  static const char* run(const GemmProblem& p, const LaunchChoices& c,
                         const DeviceSlots& s, void* workspace,
                         size_t workspace_bytes, cudaStream_t stream) {
    if (!kHasStreamK && c.schedule != Schedule::kStatic)
      return "this variant only schedules statically";
    return launch_cutlass<Gemm>(arguments(p, c, s), workspace, workspace_bytes, stream);
  }

  static int max_active_clusters(int device_id) {
    return occupancy_max_active_clusters<Kernel>(device_id);
  }

  static constexpr VariantOps ops{&workspace_size, &run, &max_active_clusters};
};

}  // namespace jax_cluster::sm90
