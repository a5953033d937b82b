// sm90a grouped GEMM for ragged_dot: CUTLASS's pointer-array cooperative
// kernel (TMA + wgmma; per-group TMA descriptors rewritten on the device),
// scheduled dynamically over the tiles of all groups
// (sm90_dynamic_group_scheduler.cuh), with the per-group arrays built on the
// device from group_sizes (ragged_groups.cuh). No host round trip.
//
// Contract (GemmProblem's GEMM view; all buffers packed, row-major):
//   ragged_m: A [rows, K]; B [G, K, N] (B n-major) or [G, N, K] (k-major);
//             D [rows, N]; rows past the groups are zero.
//   ragged_k: A [rows, K'] read transposed (A m-major); B [rows, N'];
//             D [G, K', N']; a group without rows gives zeros.
// Workspace: the per-group arrays, then CUTLASS's (tensormaps, tile counter).
#pragma once

#include <cuda_runtime_api.h>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>

#include "common/gemm_problem.h"
#include "kernels/cutlass_universal_gemm.cuh"
#include "kernels/ragged_groups.cuh"
#include "kernels/ragged_workspace.cuh"
#include "kernels/sm90/sm90_dynamic_group_scheduler.cuh"

namespace jax_cluster::sm90 {

template <class ElementAB, class ElementD, class LayoutA, class LayoutB, int TileM, int TileN,
          int TileK, int Stages, RaggedProblem Problem>
struct GroupedGemm {
  static constexpr int kAlignAB = 16 / sizeof(ElementAB);
  static constexpr int kAlignD = 16 / sizeof(ElementD);
  using TileShape = cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::Int<TileK>>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, cutlass::layout::RowMajor*, kAlignD,  // no C operand: beta = 0
      ElementD, cutlass::layout::RowMajor*, kAlignD,
      cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      ElementAB, LayoutA*, kAlignAB, ElementAB, LayoutB*, kAlignAB, float,
      TileShape, ClusterShape, cutlass::gemm::collective::StageCount<Stages>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<RaggedProblemShape, CollectiveMainloop,
                                                      CollectiveEpilogue, cutlass::gemm::GroupScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  static_assert(Kernel::SharedStorageSize <= 227 * 1024,
                "variant does not fit in shared memory: lower its stages in variants.json");

  using Shape = typename RaggedProblemShape::UnderlyingProblemShape;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using Arrays = RaggedGroupArrays<Shape, ElementAB, ElementAB, ElementD, StrideA, StrideB, StrideD>;

  using Workspace = RaggedWorkspace<Arrays, Problem>;

  static typename Gemm::Arguments arguments(const GemmProblem& p, const DeviceSlots& s,
                                            const Arrays& arrays) {
    RaggedProblemShape shapes;
    shapes.num_groups = p.batch;
    shapes.problem_shapes = arrays.shapes;  // on the device only: no host copy
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGrouped, shapes,
        {arrays.a, arrays.stride_a, arrays.b, arrays.stride_b},
        {{}, nullptr, nullptr, arrays.d, arrays.stride_d}};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    args.hw_info.device_id = s.device_id;
    args.hw_info.sm_count = s.sm_count;
    args.hw_info.max_active_clusters = s.max_active_clusters;
    args.scheduler.raster_order = cutlass::gemm::kernel::detail::RasterOrderOptions::AlongM;
    args.scheduler.max_swizzle_size = 1;
    return args;
  }

  static size_t cutlass_workspace(const GemmProblem& p, const DeviceSlots& s) {
    return Gemm::get_workspace_size(arguments(p, s, Arrays{}));
  }

  static size_t workspace_size(const GemmProblem& p, const LaunchChoices&, const DeviceSlots& s) {
    return Workspace::layout(p.batch, cutlass_workspace(p, s), false).total;
  }

  static const char* run(const GemmProblem& p, const LaunchChoices& c, const DeviceSlots& s,
                         void* workspace, size_t workspace_bytes, cudaStream_t stream) {
    if (p.group_sizes == nullptr || p.batch < 1) return "a grouped variant needs group sizes";
    if (c.schedule != Schedule::kDynamic) return "grouped variants run the dynamic schedule only";
    auto l = Workspace::layout(p.batch, cutlass_workspace(p, s), false);
    if (l.total > workspace_bytes) return "workspace buffer is smaller than the variant needs";
    Arrays arrays = Workspace::arrays(workspace, l, false);
    if (const char* err = Workspace::prepare(p, arrays, 2 * s.sm_count, stream)) return err;

    return initialize_and_run<Gemm>(arguments(p, s, arrays), static_cast<char*>(workspace) + l.cutlass,
                                     stream);
  }

  static int max_active_clusters(int device_id) {
    return occupancy_max_active_clusters<Kernel>(device_id);
  }

  static constexpr VariantOps ops{&workspace_size, &run, &max_active_clusters};
};

}  // namespace jax_cluster::sm90
