// One CUTLASS pointer-array grouped GEMM variant for ragged_dot: the builder
// types, its arguments, and the entry points the dispatch table calls. The
// sm90 and sm100 grouped families are a Scheduling policy over this template;
// the policy says which Plan schedule the kernel runs, what it launches and
// what it adds to CUTLASS's arguments.
//
// Contract (GemmProblem's GEMM view; all buffers packed, row-major):
//   ragged_m: A [rows, K]; B [G, K, N] (B n-major) or [G, N, K] (k-major);
//             D [rows, N]; rows past the groups are zero.
//   ragged_k: A [rows, K'] read transposed (A m-major); B [rows, N'];
//             D [G, K', N']; a group without rows gives zeros.
//   ragged_k, block-scaled: A [K', rows] and B [N', rows] (K-major, the rows
//             contiguous), each group's rows starting at a multiple of 128
//             (kScaleBlock); D [G, K', N'].
// Workspace: ragged_workspace.cuh (per-group arrays, then CUTLASS's).
#pragma once

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

namespace jax_cluster {

// How the grouped mainloop reads A and B (a variant's dtype decides).
struct GroupedPlainOperands {
  static constexpr bool kBlockScaled = false;
  static constexpr bool kBlockAlignedGroups = false;
  template <int Stages, int EpilogueBytes>
  using StageCount = cutlass::gemm::collective::StageCount<Stages>;
  template <class Layout>
  using LayoutA = Layout*;
  template <class Layout>
  using LayoutB = Layout*;
  template <class MainloopArguments, class Arrays>
  static MainloopArguments mainloop(const Arrays& arrays) {
    return {arrays.a, arrays.stride_a, arrays.b, arrays.stride_b};
  }
};

// fp8 A and B with float32 block scales (ragged_m): A in 1 x kScaleBlock tiles
// with its scales K-major, [rows, K/128], so each group's are one contiguous
// slice of rows; each group's B [N, K] in kScaleBlock x kScaleBlock blocks, one
// [K/128, ceil(N/128)] block of scales (MN-major) per group.
template <class ScaleConfig>
struct GroupedScaledOperands {
  static constexpr bool kBlockScaled = true;
  template <int Stages, int EpilogueBytes>
  using StageCount = cutlass::gemm::collective::StageCountAutoCarveout<EpilogueBytes>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
  template <class Layout>
  using LayoutA = cute::tuple<Layout*, LayoutSFA*>;
  template <class Layout>
  using LayoutB = cute::tuple<Layout*, LayoutSFB*>;
  template <class MainloopArguments, class Arrays>
  static MainloopArguments mainloop(const Arrays& arrays) {
    // CUTLASS's sm90 array mainloop lays each group's scales out from the
    // group's own shape; it does not read per-group layout arrays.
    return {arrays.a,       arrays.stride_a, arrays.b,       arrays.stride_b,
            arrays.scale_a, nullptr,         arrays.scale_b, nullptr};
  }
};

struct GroupedBlockScaledOperands
    : GroupedScaledOperands<cutlass::detail::Sm90BlockwiseScaleConfig<
          1, kScaleBlock, kScaleBlock, cute::GMMA::Major::K, cute::GMMA::Major::MN>> {
  static constexpr bool kBlockAlignedGroups = false;
};

// fp8 A and B with float32 scales for the weight gradient (ragged_k), where
// both operands run along the contracted tokens in 1 x kScaleBlock tiles. A
// tile must not straddle two groups, so each group's rows start at a
// multiple of kScaleBlock (the producer pads); the tails past a group's size
// are outside its TMA box and read as zeros. Scales MN-major, [rows/128, K']
// and [rows/128, N']: each group's are one contiguous slice of block rows,
// laid out as CUTLASS's array mainloop expects from the group's own shape.
struct GroupedTokenScaledOperands
    : GroupedScaledOperands<cutlass::detail::Sm90BlockwiseScaleConfig<
          1, 1, kScaleBlock, cute::GMMA::Major::MN, cute::GMMA::Major::MN>> {
  static constexpr bool kBlockAlignedGroups = true;
};

// Scheduling provides: ProblemShape (the tag type that selects its CUTLASS
// scheduler), kSchedule, kTileStart (whether it reads tile_start), a Launch
// computed from the problem (fits(), cluster_tile_m, tiles_n) and
// configure(args, slots, arrays, launch) for the scheduler fields.
template <class Arch, class ElementAB, class ElementD, class LayoutA, class LayoutB,
          class TileShape, class ClusterShape, int Stages, class MainloopSchedule,
          class EpilogueSchedule, RaggedProblem Problem, class Scheduling,
          class Operands = GroupedPlainOperands>
struct CutlassGroupedGemm {
  static constexpr int kAlignAB = 16 / sizeof(ElementAB);
  static constexpr int kAlignD = 16 / sizeof(ElementD);
  using ProblemShape = typename Scheduling::ProblemShape;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      Arch, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void,
      cutlass::layout::RowMajor*, kAlignD,  // no C operand: beta = 0
      ElementD, cutlass::layout::RowMajor*, kAlignD, EpilogueSchedule>::CollectiveOp;

  // the weight gradient's scale tiles run along the ragged rows: groups must start on a tile
  static_assert(!Operands::kBlockScaled ||
                    Operands::kBlockAlignedGroups == (Problem == RaggedProblem::kRaggedK),
                "block-scaled ragged_k needs block-aligned groups, ragged_m does not");
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      Arch, cutlass::arch::OpClassTensorOp, ElementAB, typename Operands::template LayoutA<LayoutA>,
      kAlignAB, ElementAB, typename Operands::template LayoutB<LayoutB>, kAlignAB, float, TileShape,
      ClusterShape,
      typename Operands::template StageCount<
          Stages, static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;
  static_assert(CollectiveMainloop::DispatchPolicy::Stages == Stages,
                "the mainloop's pipeline has another stage count than the menu row names");

  // Grouped kernels take their scheduler from the problem-shape type, not the tag.
  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue,
                                           cutlass::gemm::GroupScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  static_assert(Kernel::SharedStorageSize <= 227 * 1024,
                "variant does not fit in shared memory: lower its stages in variants.json");

  using Shape = typename ProblemShape::UnderlyingProblemShape;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using Arrays =
      RaggedGroupArrays<Shape, ElementAB, ElementAB, ElementD, StrideA, StrideB, StrideD>;
  using Workspace = RaggedWorkspace<Arrays, Problem>;
  using Launch = typename Scheduling::Launch;

  static typename Gemm::Arguments arguments(const GemmProblem& p, const DeviceSlots& s,
                                            const Arrays& arrays, const Launch& launch) {
    ProblemShape shapes;
    shapes.num_groups = p.batch;
    shapes.problem_shapes = arrays.shapes;  // on the device only: no host copy
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGrouped,
        shapes,
        Operands::template mainloop<typename CollectiveMainloop::Arguments>(arrays),
        {{}, nullptr, nullptr, arrays.d, arrays.stride_d}};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    args.hw_info.device_id = s.device_id;
    args.hw_info.sm_count = s.sm_count;
    args.hw_info.max_active_clusters = s.max_active_clusters;
    Scheduling::configure(args, s, arrays, launch);
    return args;
  }

  static size_t cutlass_workspace(const GemmProblem& p, const DeviceSlots& s,
                                  const Launch& launch) {
    return Gemm::get_workspace_size(arguments(p, s, Arrays{}, launch));
  }

  static size_t workspace_size(const GemmProblem& p, const LaunchChoices&, const DeviceSlots& s) {
    Launch launch = Scheduling::launch(p);
    if (!launch.fits()) return 0;  // run() refuses it
    return Workspace::layout(p.batch, cutlass_workspace(p, s, launch), Scheduling::kTileStart,
                             Operands::kBlockScaled)
        .total;
  }

  static const char* run(const GemmProblem& p, const LaunchChoices& c, const DeviceSlots& s,
                         void* workspace, size_t workspace_bytes, cudaStream_t stream) {
    if (p.group_sizes == nullptr || p.batch < 1) return "a grouped variant needs group sizes";
    if (c.schedule != Scheduling::kSchedule)
      return "a grouped variant runs its kind's one schedule only";
    Launch launch = Scheduling::launch(p);
    if (!launch.fits()) return "too many tiles for one grouped launch";
    if (Operands::kBlockScaled && (p.scale_a == nullptr || p.scale_b == nullptr))
      return "a block-scaled variant needs the scales of A and B";
    auto l = Workspace::layout(p.batch, cutlass_workspace(p, s, launch), Scheduling::kTileStart,
                               Operands::kBlockScaled);
    if (l.total > workspace_bytes) return "workspace buffer is smaller than the variant needs";
    Arrays arrays = Workspace::arrays(workspace, l, Scheduling::kTileStart, Operands::kBlockScaled);
    if (const char* err = Workspace::template prepare<Operands::kBlockAlignedGroups>(
            p, arrays, 2 * s.sm_count, stream, launch.cluster_tile_m, launch.tiles_n))
      return err;
    return initialize_and_run<Gemm>(arguments(p, s, arrays, launch),
                                    static_cast<char*>(workspace) + l.cutlass, stream);
  }

  static int max_active_clusters(int device_id) {
    return occupancy_max_active_clusters<Kernel>(device_id);
  }

  static constexpr VariantOps ops{&workspace_size, &run, &max_active_clusters};
};

}  // namespace jax_cluster
