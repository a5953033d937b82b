// sm100a dense GEMM: tcgen05 UMMA with TMEM accumulators, built on CUTLASS's
// sm100 collectives. Compiled and SASS-checked here; never run (no Blackwell).
//
// Contract: as the sm90 family (A [M,K]/[K,M], B [N,K]/[K,N], D [M,N]
//   row-major, packed, 16-byte leading dimensions, fp32 accumulation, beta = 0).
// Sharing: 2-SM variants issue cta_group::2 UMMA over a CTA pair and load
//   operands with 2-SM TMA multicast; 1-SM variants keep each MMA in one CTA.
// Scheduling: Clc uses CUTLASS's Cluster Launch Control scheduler (the
//   hardware hands out the next tile); Static strides a persistent grid.
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

namespace jax_cluster::sm100 {

struct TwoSm {
  using Mainloop = cutlass::gemm::KernelTmaWarpSpecialized2SmSm100;
  using Epilogue = cutlass::epilogue::TmaWarpSpecialized2Sm;
};
struct OneSm {
  using Mainloop = cutlass::gemm::KernelTmaWarpSpecialized1SmSm100;
  using Epilogue = cutlass::epilogue::TmaWarpSpecialized1Sm;
};
struct Clc {
  using Scheduler = void;  // CUTLASS's default on sm100: Cluster Launch Control
};
struct Static {
  using Scheduler = cutlass::gemm::StaticPersistentScheduler;
};

template <class ElementAB, class ElementD, class LayoutA, class LayoutB,
          int MmaM, int MmaN, int MmaK, int ClusterM, int ClusterN, int Stages,
          class Cta, class Sched>
struct GemmTcgen05Persistent {
  using MmaTileShape = cute::Shape<cute::Int<MmaM>, cute::Int<MmaN>, cute::Int<MmaK>>;
  using ClusterShape = cute::Shape<cute::Int<ClusterM>, cute::Int<ClusterN>, cute::_1>;
  static constexpr int kAlignAB = 16 / sizeof(ElementAB);
  static constexpr int kAlignD = 16 / sizeof(ElementD);

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassTensorOp, MmaTileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, cutlass::layout::RowMajor, kAlignD,
      ElementD, cutlass::layout::RowMajor, kAlignD,
      typename Cta::Epilogue>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassTensorOp,
      ElementAB, LayoutA, kAlignAB, ElementAB, LayoutB, kAlignAB, float,
      MmaTileShape, ClusterShape, cutlass::gemm::collective::StageCount<Stages>,
      typename Cta::Mainloop>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<
      cute::Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue,
      typename Sched::Scheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static_assert(Kernel::SharedStorageSize <= 227 * 1024,
                "variant does not fit in sm100 shared memory: lower its stages");

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
    using RO = cutlass::gemm::kernel::detail::RasterOrderOptions;
    args.scheduler.raster_order = c.raster == Raster::kAlongM ? RO::AlongM : RO::AlongN;
    return args;
  }

  static size_t workspace_size(const GemmProblem& p, const LaunchChoices& c,
                               const DeviceSlots& s) {
    return Gemm::get_workspace_size(arguments(p, c, s));
  }

  static const char* run(const GemmProblem& p, const LaunchChoices& c,
                         const DeviceSlots& s, void* workspace,
                         size_t workspace_bytes, cudaStream_t stream) {
    if (c.schedule != Schedule::kStatic)
      return "sm100 variants take only the clc/static schedule they were built with";
    return launch_cutlass<Gemm>(arguments(p, c, s), workspace, workspace_bytes, stream);
  }

  static int max_active_clusters(int device_id) {
    return occupancy_max_active_clusters<Kernel>(device_id);
  }

  static constexpr VariantOps ops{&workspace_size, &run, &max_active_clusters};
};

}  // namespace jax_cluster::sm100
