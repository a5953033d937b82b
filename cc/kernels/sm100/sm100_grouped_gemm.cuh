// sm100a grouped GEMM for ragged_dot: CUTLASS's pointer-array kernel with
// 2-CTA tcgen05 UMMA (a 256-row MMA over a CTA pair, 2-SM TMA loads, per-group
// TMA descriptors rewritten on the device), scheduled by Cluster Launch
// Control over the tiles of all groups (sm100_clc_group_scheduler.cuh).
// The per-group arrays and tile_start are built on the device from
// group_sizes (ragged_groups.cuh); the host never sees the sizes.
// Compiled and SASS-checked here; never run (no Blackwell).
//
// Contract: as the sm90 grouped family (sm90_grouped_gemm.cuh): ragged_m A
//   [rows, K], B [G, K, N] / [G, N, K], D [rows, N]; ragged_k A [rows, K'] read
//   transposed, B [rows, N'], D [G, K', N']; packed, row-major, beta = 0.
// Launch: one 2x1 cluster per cluster tile of an upper bound on the tile
//   count. hw_info.sm_count is set to the launched CTA count: CUTLASS sizes
//   and indexes its per-CTA descriptor copies by it (the only use it has on
//   the grouped path), so it is not an SM count here.
// Workspace: the per-group arrays and tile_start, then CUTLASS's (descriptors).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include "common/gemm_problem.h"
#include "kernels/cutlass_universal_gemm.cuh"
#include "kernels/ragged_groups.cuh"
#include "kernels/ragged_workspace.cuh"
#include "kernels/sm100/sm100_clc_group_scheduler.cuh"

namespace jax_cluster::sm100 {

template <class ElementAB, class ElementD, class LayoutA, class LayoutB, int MmaM, int MmaN,
          int MmaK, int Stages, RaggedProblem Problem>
struct GroupedGemm {
  static_assert(MmaM == 256, "2-CTA grouped variants run a 256-row MMA over a CTA pair");
  static constexpr int kAlignAB = 16 / sizeof(ElementAB);
  static constexpr int kAlignD = 16 / sizeof(ElementD);
  using MmaTile = cute::Shape<cute::Int<MmaM>, cute::Int<MmaN>, cute::Int<MmaK>>;
  using ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassTensorOp, MmaTile, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, cutlass::layout::RowMajor*, kAlignD,  // no C operand: beta = 0
      ElementD, cutlass::layout::RowMajor*, kAlignD,
      cutlass::epilogue::PtrArrayTmaWarpSpecialized2Sm>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassTensorOp,
      ElementAB, LayoutA*, kAlignAB, ElementAB, LayoutB*, kAlignAB, float,
      MmaTile, ClusterShape, cutlass::gemm::collective::StageCount<Stages>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecialized2SmSm100>::CollectiveOp;

  // The scheduler tag is ignored for grouped kernels; RaggedClcShape picks ours.
  using Kernel = cutlass::gemm::kernel::GemmUniversal<RaggedClcShape, CollectiveMainloop,
                                                      CollectiveEpilogue, void>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  static_assert(Kernel::SharedStorageSize <= 227 * 1024,
                "variant does not fit in shared memory: lower its stages in variants.json");
  static_assert(Kernel::IsSchedDynamicPersistent, "the CLC group scheduler was not selected");

  using Shape = typename RaggedClcShape::UnderlyingProblemShape;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using Arrays = RaggedGroupArrays<Shape, ElementAB, ElementAB, ElementD, StrideA, StrideB, StrideD>;
  using Workspace = RaggedWorkspace<Arrays, Problem>;

  // Cluster tiles: MmaM rows (both CTAs of the pair) by one MmaN column tile.
  struct Tiling {
    int tiles_n = 0;
    int64_t bound_clusters = 0;  // upper bound on the cluster tiles of all groups
  };

  // ragged_m: each non-empty group wastes less than one row tile, so
  // floor((M + min(G, M) * (MmaM - 1)) / MmaM) row tiles bound the sum.
  // ragged_k: every group with rows covers all of K' (GEMM m).
  static Tiling tiling(const GemmProblem& p) {
    Tiling t;
    t.tiles_n = (p.n + MmaN - 1) / MmaN;
    int64_t row_tiles =
        Problem == RaggedProblem::kRaggedM
            ? (int64_t(p.m) + std::min<int64_t>(p.batch, p.m) * (MmaM - 1)) / MmaM
            : int64_t(p.batch) * ((int64_t(p.m) + MmaM - 1) / MmaM);
    t.bound_clusters = std::max<int64_t>(row_tiles * t.tiles_n, 1);  // a launch needs a cluster
    return t;
  }

  // tile_start and CUTLASS's tile ids are int32; the grid is CTAs along x.
  static bool fits_one_launch(const Tiling& t) {
    return t.bound_clusters <= INT32_MAX / cute::size<0>(ClusterShape{});
  }

  static typename Gemm::Arguments arguments(const GemmProblem& p, const DeviceSlots& s,
                                            const Arrays& arrays, const Tiling& t) {
    RaggedClcShape shapes;
    shapes.num_groups = p.batch;
    shapes.problem_shapes = arrays.shapes;  // on the device only: no host copy
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGrouped, shapes,
        {arrays.a, arrays.stride_a, arrays.b, arrays.stride_b},
        {{}, nullptr, nullptr, arrays.d, arrays.stride_d}};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    args.hw_info.device_id = s.device_id;
    args.hw_info.sm_count = static_cast<int>(cute::size<0>(ClusterShape{}) * t.bound_clusters);
    args.hw_info.max_active_clusters = s.max_active_clusters;
    args.scheduler.tile_start = arrays.tile_start;
    args.scheduler.bound_clusters = static_cast<int32_t>(t.bound_clusters);
    args.scheduler.tiles_n = t.tiles_n;
    return args;
  }

  static size_t cutlass_workspace(const GemmProblem& p, const DeviceSlots& s, const Tiling& t) {
    return Gemm::get_workspace_size(arguments(p, s, Arrays{}, t));
  }

  static size_t workspace_size(const GemmProblem& p, const LaunchChoices&, const DeviceSlots& s) {
    Tiling t = tiling(p);
    if (!fits_one_launch(t)) return 0;  // run() refuses it
    return Workspace::layout(p.batch, cutlass_workspace(p, s, t), true).total;
  }

  static const char* run(const GemmProblem& p, const LaunchChoices& c, const DeviceSlots& s,
                         void* workspace, size_t workspace_bytes, cudaStream_t stream) {
    if (p.group_sizes == nullptr || p.batch < 1) return "a grouped variant needs group sizes";
    if (c.schedule != Schedule::kClc) return "sm100 grouped variants run the clc schedule only";
    Tiling t = tiling(p);
    if (!fits_one_launch(t)) return "too many tiles for one grouped launch";
    auto l = Workspace::layout(p.batch, cutlass_workspace(p, s, t), true);
    if (l.total > workspace_bytes) return "workspace buffer is smaller than the variant needs";
    Arrays arrays = Workspace::arrays(workspace, l, true);
    if (const char* err = Workspace::prepare(p, arrays, 2 * s.sm_count, stream, MmaM, t.tiles_n))
      return err;
    return initialize_and_run<Gemm>(arguments(p, s, arrays, t),
                                    static_cast<char*>(workspace) + l.cutlass, stream);
  }

  static int max_active_clusters(int device_id) {
    return occupancy_max_active_clusters<Kernel>(device_id);
  }

  static constexpr VariantOps ops{&workspace_size, &run, &max_active_clusters};
};

}  // namespace jax_cluster::sm100
