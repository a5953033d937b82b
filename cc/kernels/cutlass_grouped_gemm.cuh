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
//   ragged_m, MX (sm100): A [rows, K] and B [G, N, K] in e4m3, K-major, with
//             e8m0 scales as GroupedMxOperands lays them out.
//   ragged_k, MX (sm100): A [K', rows] and B [N', rows] in e4m3 in the
//             block-aligned layout, e8m0 scales as GroupedMxTokenOperands reads them.
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
#include "common/mx_scale_layout.h"
#include "kernels/cutlass_universal_gemm.cuh"
#include "kernels/ragged_groups.cuh"
#include "kernels/ragged_workspace.cuh"

namespace jax_cluster {

// How the grouped mainloop reads A and B (a variant's dtype decides): the
// builder's operator class and layout tags, the values A's and B's buffers
// hold, the scale arrays the workspace keeps per group, and where each
// group's scales lie (set_group_scales, called by the prepare kernel of
// ragged_groups.cuh with the group's GroupSpan).
struct GroupedPlainOperands {
  static constexpr bool kBlockScaled = false;
  static constexpr bool kBlockAlignedGroups = false;
  static constexpr bool kAlignedScaleRows = false;
  using OpClass = cutlass::arch::OpClassTensorOp;
  template <class ElementAB>
  using Value = ElementAB;
  using Scales = GroupScaleTypes<>;
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
  static bool has_scales(const GemmProblem&) { return true; }
  template <RaggedProblem P, class Arrays>
  __device__ static void set_group_scales(Arrays&, GroupSpan, int, int, int, const void*,
                                          const void*) {}
};

// fp8 A and B with float32 block scales on CUTLASS's sm90 blockwise array
// mainloop, which lays each group's scales out from the group's own shape
// (it reads no per-group layout arrays).
template <class ScaleConfig>
struct GroupedScaledOperands {
  static constexpr bool kBlockScaled = true;
  static constexpr bool kAlignedScaleRows = false;
  using OpClass = cutlass::arch::OpClassTensorOp;
  template <class ElementAB>
  using Value = ElementAB;
  using Scales = GroupScaleTypes<float>;
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
    return {arrays.a,       arrays.stride_a, arrays.b,       arrays.stride_b,
            arrays.scale_a, nullptr,         arrays.scale_b, nullptr};
  }
  static bool has_scales(const GemmProblem& p) {
    return p.scale_a != nullptr && p.scale_b != nullptr;
  }
};

// ragged_m: A in 1 x kScaleBlock tiles with its scales K-major, [rows,
// K/128], so each group's are one contiguous slice of rows; each group's B
// [N, K] in kScaleBlock x kScaleBlock blocks, one [K/128, ceil(N/128)] block
// of scales (MN-major) per group.
struct GroupedBlockScaledOperands
    : GroupedScaledOperands<cutlass::detail::Sm90BlockwiseScaleConfig<
          1, kScaleBlock, kScaleBlock, cute::GMMA::Major::K, cute::GMMA::Major::MN>> {
  static constexpr bool kBlockAlignedGroups = false;
  template <RaggedProblem P, class Arrays>
  __device__ static void set_group_scales(Arrays& out, GroupSpan s, int, int n, int k,
                                          const void* scale_a, const void* scale_b) {
    static_assert(P == RaggedProblem::kRaggedM);
    const int64_t k_blocks = k / kScaleBlock, n_blocks = (n + kScaleBlock - 1) / kScaleBlock;
    out.scale_a[s.g] = static_cast<const float*>(scale_a) + s.start * k_blocks;
    out.scale_b[s.g] = static_cast<const float*>(scale_b) + int64_t(s.g) * k_blocks * n_blocks;
  }
};

// ragged_k (the weight gradient): both operands run along the contracted
// tokens in 1 x kScaleBlock tiles. A tile must not straddle two groups, so
// each group's rows start at a multiple of kScaleBlock (the producer pads);
// the tails past a group's size are outside its TMA box and read as zeros.
// Scales MN-major, [rows/128, K'] and [rows/128, N']: each group's are one
// contiguous slice of block rows.
struct GroupedTokenScaledOperands
    : GroupedScaledOperands<cutlass::detail::Sm90BlockwiseScaleConfig<
          1, 1, kScaleBlock, cute::GMMA::Major::MN, cute::GMMA::Major::MN>> {
  static constexpr bool kBlockAlignedGroups = true;
  template <RaggedProblem P, class Arrays>
  __device__ static void set_group_scales(Arrays& out, GroupSpan s, int m, int n, int,
                                          const void* scale_a, const void* scale_b) {
    static_assert(P == RaggedProblem::kRaggedK);
    out.scale_a[s.g] = static_cast<const float*>(scale_a) + s.start / kScaleBlock * m;
    out.scale_b[s.g] = static_cast<const float*>(scale_b) + s.start / kScaleBlock * n;
  }
};

// MXFP8 (sm100): e4m3 A and B, K-major, one e8m0 scale per kMxScaleBlock
// values along K, which the block-scaled UMMA applies itself. CUTLASS's
// array mainloop reads each group's scale factors through a pointer and a
// layout per group, in its Sm1xxBlockScaledConfig layout (128-row tiles of
// 4 scale columns, the tiles of a row K-major).
struct GroupedMxOperandsBase {
  static constexpr bool kBlockScaled = true;
  using OpClass = cutlass::arch::OpClassBlockScaledTensorOp;
  template <class ElementAB>
  using Value = typename ElementAB::DataType;
  using Config = cutlass::detail::Sm1xxBlockScaledConfig<kMxScaleBlock>;
  using Scales = GroupScaleTypes<cutlass::float_ue8m0_t, decltype(Config::deduce_layoutSFA()),
                                 decltype(Config::deduce_layoutSFB())>;
  template <int Stages, int EpilogueBytes>
  using StageCount = cutlass::gemm::collective::StageCountAutoCarveout<EpilogueBytes>;
  template <class Layout>
  using LayoutA = Layout*;
  template <class Layout>
  using LayoutB = Layout*;
  template <class MainloopArguments, class Arrays>
  static MainloopArguments mainloop(const Arrays& arrays) {
    return {arrays.a,       arrays.stride_a,   arrays.b,       arrays.stride_b,
            arrays.scale_a, arrays.layout_sfa, arrays.scale_b, arrays.layout_sfb};
  }
  static bool has_scales(const GemmProblem& p) {
    return p.mx_scale_a != nullptr && p.mx_scale_b != nullptr;
  }
};

// ragged_m: A [rows, K] and each group's B [N, K]. A's scales are laid out
// per group, so each group's scales start on a row tile: scale_a holds the groups'
// tiles one after another, group g's at row aligned_start (the earlier
// groups' rows, each rounded up to 128: primitives/mx_scales.py writes them
// so); scale_b holds G blocks of layout_size(N, K) bytes.
struct GroupedMxOperands : GroupedMxOperandsBase {
  static constexpr bool kBlockAlignedGroups = false;
  static constexpr bool kAlignedScaleRows = true;
  template <RaggedProblem P, class Arrays>
  __device__ static void set_group_scales(Arrays& out, GroupSpan s, int, int n, int k,
                                          const void* scale_a, const void* scale_b) {
    static_assert(P == RaggedProblem::kRaggedM, "GroupedMxOperands serves ragged_m");
    using SF = cutlass::float_ue8m0_t;
    out.scale_a[s.g] = static_cast<const SF*>(scale_a) + s.aligned_start * mx_scale_row_bytes(k);
    out.scale_b[s.g] = static_cast<const SF*>(scale_b) + int64_t(s.g) * mx_layout_size(n, k);
    auto shape = cute::make_shape(s.rows, n, k, 1);
    out.layout_sfa[s.g] = Config::tile_atom_to_shape_SFA(shape);
    out.layout_sfb[s.g] = Config::tile_atom_to_shape_SFB(shape);
  }
};

// ragged_k (the weight gradient, contracting the tokens): A [K', rows] and
// B [N', rows], the rows contiguous and in the block-aligned layout (each
// group starting on a 128-row tile, so a 32-row scale block never holds two
// groups). Each operand's scales are one layout of the whole [K', rows] (or
// [N', rows]); group g reads its columns of it: from K tile start/128 on,
// through a layout with the group's shape and the whole layout's strides.
static_assert(kScaleBlock == kMxScaleBlock * kMxAtomBlocks,
              "a token tile of the block-aligned layout is one K tile of MX scale atoms");
struct GroupedMxTokenOperands : GroupedMxOperandsBase {
  static constexpr bool kBlockAlignedGroups = true;
  static constexpr bool kAlignedScaleRows = false;
  template <RaggedProblem P, class Arrays>
  __device__ static void set_group_scales(Arrays& out, GroupSpan s, int m, int n, int k,
                                          const void* scale_a, const void* scale_b) {
    static_assert(P == RaggedProblem::kRaggedK, "GroupedMxTokenOperands serves ragged_k");
    using SF = cutlass::float_ue8m0_t;
    // one 512-byte atom per 128 rows (of K' or N') by 128 tokens, a row tile's atoms K-major
    constexpr int64_t kAtomBytes = kMxAtomRows * kMxAtomBlocks;
    const int64_t first_tile = s.start / (kMxScaleBlock * kMxAtomBlocks);
    out.scale_a[s.g] = static_cast<const SF*>(scale_a) + first_tile * kAtomBytes;
    out.scale_b[s.g] = static_cast<const SF*>(scale_b) + first_tile * kAtomBytes;
    // an empty group runs no tile; one token tile keeps its layout well formed
    const int tokens = static_cast<int>(round_up_to_tile(s.rows > 0 ? s.rows : 1));
    auto whole = cute::make_shape(m, n, k, 1);
    auto group = cute::make_shape(m, n, tokens, 1);
    auto sfa = Config::tile_atom_to_shape_SFA(whole), sfb = Config::tile_atom_to_shape_SFB(whole);
    out.layout_sfa[s.g] =
        cute::make_layout(Config::tile_atom_to_shape_SFA(group).shape(), sfa.stride());
    out.layout_sfb[s.g] =
        cute::make_layout(Config::tile_atom_to_shape_SFB(group).shape(), sfb.stride());
  }
};

// How a grouped variant writes D: CUTLASS's collective epilogue for the
// plain product (D = A·B in D's dtype, no C operand), on `Schedule`.
// Epilogue policies provide kColumnsPerOutput (GEMM columns per column of
// D), Collective<...> and arguments(problem, arrays).
template <class Schedule>
struct PlainGroupedEpilogue {
  static constexpr int kColumnsPerOutput = 1;
  template <class Arch, class OpClass, class TileShape, class ClusterShape, class ElementD,
            int AlignD>
  using Collective = typename cutlass::epilogue::collective::CollectiveBuilder<
      Arch, OpClass, TileShape, ClusterShape, cutlass::epilogue::collective::EpilogueTileAuto,
      float, float, void, cutlass::layout::RowMajor*, AlignD,  // no C operand: beta = 0
      ElementD, cutlass::layout::RowMajor*, AlignD, Schedule>::CollectiveOp;
  template <class Arguments, class Arrays>
  static Arguments arguments(const GemmProblem&, const Arrays& arrays) {
    Arguments e{{}, nullptr, nullptr, arrays.d, arrays.stride_d};
    e.thread.alpha = 1.0f;
    e.thread.beta = 0.0f;
    return e;
  }
};

// Scheduling provides: ProblemShape (the tag type that selects its CUTLASS
// scheduler), kSchedule, kTileStart (whether it reads tile_start), a Launch
// computed from the problem (fits(), cluster_tile_m, tiles_n) and
// configure(args, slots, arrays, launch) for the scheduler fields.
template <class Row, class Arch, class ElementAB, class ElementD, class LayoutA, class LayoutB,
          class TileShape, class ClusterShape, int Stages, class MainloopSchedule, class Epilogue,
          RaggedProblem Problem, class Scheduling, class Operands = GroupedPlainOperands>
struct CutlassGroupedGemm {
  using Value = typename Operands::template Value<ElementAB>;  // what A's and B's buffers hold
  static constexpr int kAlignAB = 16 / sizeof(Value);
  static constexpr int kAlignD = 16 / sizeof(ElementD);
  using ProblemShape = typename Scheduling::ProblemShape;
  using OpClass = typename Operands::OpClass;

  using CollectiveEpilogue =
      typename Epilogue::template Collective<Arch, OpClass, TileShape, ClusterShape, ElementD,
                                             kAlignD>;
  static_assert(Epilogue::kColumnsPerOutput == 1 || Problem == RaggedProblem::kRaggedM,
                "an epilogue that narrows D serves ragged_m");

  // the weight gradient's scale tiles run along the ragged rows: groups must start on a tile
  static_assert(!Operands::kBlockScaled ||
                    Operands::kBlockAlignedGroups == (Problem == RaggedProblem::kRaggedK),
                "block-scaled ragged_k needs block-aligned groups, ragged_m does not");
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      Arch, OpClass, ElementAB, typename Operands::template LayoutA<LayoutA>, kAlignAB, ElementAB,
      typename Operands::template LayoutB<LayoutB>, kAlignAB, float, TileShape, ClusterShape,
      typename Operands::template StageCount<
          Stages, static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;
  static_assert(CollectiveMainloop::DispatchPolicy::Stages == Stages,
                "the mainloop's pipeline has another stage count than the menu row names");

  // Grouped kernels take their scheduler from the problem-shape type, not the tag.
  using Kernel = RowKernel<
      Row, cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop,
                                                CollectiveEpilogue, cutlass::gemm::GroupScheduler>>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  static_assert(Kernel::SharedStorageSize <= 227 * 1024,
                "variant does not fit in shared memory: lower its stages in variants.json");

  using Shape = typename ProblemShape::UnderlyingProblemShape;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using Arrays = RaggedGroupArrays<Shape, Value, Value, ElementD, StrideA, StrideB, StrideD,
                                   typename Operands::Scales>;
  using Workspace = RaggedWorkspace<Arrays, Problem>;
  using Launch = typename Scheduling::Launch;

  static typename Gemm::Arguments arguments(const GemmProblem& p, const DeviceSlots& s,
                                            const Arrays& arrays, const Launch& launch) {
    ProblemShape shapes;
    shapes.num_groups = p.batch;
    shapes.problem_shapes = arrays.shapes;  // on the device only: no host copy
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGrouped, shapes,
        Operands::template mainloop<typename CollectiveMainloop::Arguments>(arrays),
        Epilogue::template arguments<typename CollectiveEpilogue::Arguments>(p, arrays)};
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
    if (!Operands::has_scales(p)) return "a block-scaled variant needs the scales of A and B";
    auto l = Workspace::layout(p.batch, cutlass_workspace(p, s, launch), Scheduling::kTileStart,
                               Operands::kBlockScaled);
    if (l.total > workspace_bytes) return "workspace buffer is smaller than the variant needs";
    Arrays arrays = Workspace::arrays(workspace, l, Scheduling::kTileStart, Operands::kBlockScaled);
    if (p.n % Epilogue::kColumnsPerOutput) return "N does not split into the epilogue's pairs";
    if (const char* err = Workspace::template prepare<Operands>(
            p, p.n / Epilogue::kColumnsPerOutput, arrays, 2 * s.sm_count, stream,
            launch.cluster_tile_m, launch.tiles_n))
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
