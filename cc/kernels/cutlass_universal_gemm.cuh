// One CUTLASS 3.x universal GEMM variant, built from the collective builders:
// the type, its arguments, and the entry points the dispatch table calls.
// The sm90 and sm100 families are policy choices over this template.
#pragma once

#include <mutex>
#include <set>
#include <type_traits>

#include <cuda_runtime_api.h>

#include <cute/tensor.hpp>
#include <cutlass/cluster_launch.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/detail/blockwise_scale_layout.hpp>
#include <cutlass/device_kernel.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/gemm/kernel/tile_scheduler.hpp>
#include <cutlass/util/packed_stride.hpp>
#include <cutlass/workspace.h>

#include "common/gemm_problem.h"
#include "kernels/epilogue_activation.cuh"
#include "kernels/kept_params.h"
#include "kernels/launch_recording.h"
#include "kernels/sm90/work_queue_counter.cuh"

namespace jax_cluster {

// A CUTLASS kernel named after its menu row (Row: an empty tag type that
// cc/gen_variants.py declares per row). The kernel is Kernel's own; only its
// symbol, cutlass::device_kernel<RowKernel<Row, Kernel>>, carries the row's
// name, so that rows of different kinds can share a build unit and the
// machine-code checks still tell each row's kernel apart.
template <class Row, class Kernel>
struct RowKernel : Kernel {};

// What a variant computes after the mainloop (its menu row's "epilogue").
struct PlainEpilogue {  // D = A·B; no C operand
  static constexpr bool kFused = false;
  template <class ElementD>
  using ElementC = void;
  template <class ElementD>
  using FusionOp = cutlass::epilogue::fusion::LinearCombination<ElementD, float, void, float>;
};

struct BiasActEpilogue {  // D = act(alpha * A·B + beta * C + bias[n])
  static constexpr bool kFused = true;
  template <class ElementD>
  using ElementC = ElementD;
  template <class ElementD>
  using FusionOp =
      cutlass::epilogue::fusion::LinCombPerColBiasEltAct<RuntimeActivation, ElementD, float,
                                                         ElementD, ElementD, float>;
};

// How the mainloop reads A and B (a variant's dtype decides): as they are,
// or as fp8 with float32 block scales that it applies to each K block's
// partial sums before adding them to the fp32 accumulators.
struct PlainOperands {
  static constexpr bool kBlockScaled = false;
  using OpClass = cutlass::arch::OpClassTensorOp;
  template <class ElementAB>
  using Value = ElementAB;  // what A's and B's buffers hold
  template <int Stages, int EpilogueBytes>
  using StageCount = cutlass::gemm::collective::StageCount<Stages>;
  template <class Layout>
  using LayoutA = Layout;
  template <class Layout>
  using LayoutB = Layout;
  template <class Mainloop, class ElementAB, class StrideA, class StrideB>
  static typename Mainloop::Arguments mainloop(const GemmProblem&, int, int, const void* a,
                                               StrideA sa, const void* b, StrideB sb) {
    return {static_cast<const ElementAB*>(a), sa, static_cast<const ElementAB*>(b), sb};
  }
  static bool has_scales(const GemmProblem&) { return true; }
};

// A in 1 x kScaleBlock tiles along K, B in kScaleBlock x kScaleBlock blocks;
// both scale arrays K-block-major (CUTLASS's MN-major scale layout).
struct BlockScaledOperands {
  static constexpr bool kBlockScaled = true;
  using OpClass = cutlass::arch::OpClassTensorOp;
  template <class ElementAB>
  using Value = ElementAB;
  // CUTLASS's builder sizes this mainloop's pipeline itself (the scales take
  // shared memory too); the menu row names the count it arrives at.
  template <int Stages, int EpilogueBytes>
  using StageCount = cutlass::gemm::collective::StageCountAutoCarveout<EpilogueBytes>;
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, kScaleBlock, kScaleBlock>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
  template <class Layout>
  using LayoutA = cute::tuple<Layout, LayoutSFA>;
  template <class Layout>
  using LayoutB = cute::tuple<Layout, LayoutSFB>;
  template <class Mainloop, class ElementAB, class StrideA, class StrideB>
  static typename Mainloop::Arguments mainloop(const GemmProblem& p, int m, int n, const void* a,
                                               StrideA sa, const void* b, StrideB sb) {
    auto shape = cute::make_shape(m, n, p.k, p.batch);
    return {static_cast<const ElementAB*>(a),
            sa,
            static_cast<const ElementAB*>(b),
            sb,
            p.scale_a,
            ScaleConfig::tile_atom_to_shape_SFA(shape),
            p.scale_b,
            ScaleConfig::tile_atom_to_shape_SFB(shape)};
  }
  static bool has_scales(const GemmProblem& p) {
    return p.scale_a != nullptr && p.scale_b != nullptr;
  }
};

// MXFP8 on sm100 (ElementAB is cutlass::mx_float8_t<...>): A and B K-major
// fp8 with one e8m0 scale per 32 values along K, which the block-scaled UMMA
// applies itself; the scales in CUTLASS's sm100 scale-factor layout
// (Sm1xxBlockScaledConfig), which the FFI handler checks by size.
struct MxScaledOperands {
  static constexpr bool kBlockScaled = true;
  using OpClass = cutlass::arch::OpClassBlockScaledTensorOp;
  template <class ElementAB>
  using Value = typename ElementAB::DataType;
  template <int Stages, int EpilogueBytes>
  using StageCount = cutlass::gemm::collective::StageCountAutoCarveout<EpilogueBytes>;
  template <class Layout>
  using LayoutA = Layout;
  template <class Layout>
  using LayoutB = Layout;
  template <class Mainloop, class ElementAB, class StrideA, class StrideB>
  static typename Mainloop::Arguments mainloop(const GemmProblem& p, int m, int n, const void* a,
                                               StrideA sa, const void* b, StrideB sb) {
    using Config = typename Mainloop::Sm1xxBlkScaledConfig;
    using ElementSF = typename ElementAB::ScaleFactorType;
    auto shape = cute::make_shape(m, n, p.k, p.batch);
    return {static_cast<const Value<ElementAB>*>(a),     sa,
            static_cast<const Value<ElementAB>*>(b),     sb,
            static_cast<const ElementSF*>(p.mx_scale_a), Config::tile_atom_to_shape_SFA(shape),
            static_cast<const ElementSF*>(p.mx_scale_b), Config::tile_atom_to_shape_SFB(shape)};
  }
  static bool has_scales(const GemmProblem& p) {
    return p.mx_scale_a != nullptr && p.mx_scale_b != nullptr;
  }
};

// Sets the kernel's shared-memory size (and, on sm90, the non-portable
// cluster permission) once per device. CUTLASS's adapter sets the first in
// every initialize() (2.1 us of host time per call) and its cluster launcher
// the second on every launch (a 2x1-cluster launch took 2.5 us more than a
// 1x1 one's 3.4), host time per call measured on an H200 on 2026-12-01
// (benchmarks/results/h200/investigations/host_call_phases.log).
template <class Kernel>
cudaError_t set_kernel_attributes_once() {
  static std::mutex mu;
  static std::set<int> done;
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  std::lock_guard<std::mutex> lock(mu);
  if (done.count(device)) return cudaSuccess;
  const void* fn = reinterpret_cast<const void*>(&cutlass::device_kernel<Kernel>);
  int smem = static_cast<int>(Kernel::SharedStorageSize);
  if (smem >= (48 << 10)) {
    if (cudaError_t err =
            cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        err != cudaSuccess)
      return err;
  }
  if constexpr (Kernel::ArchTag::kMinComputeCapability == 90) {
    if (cudaError_t err =
            cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        err != cudaSuccess)
      return err;
  }
  done.insert(device);
  return cudaSuccess;
}

// Clusters of this kernel that fit on the device at once, counting the
// dynamic shared memory it really uses; 0 if the query fails.
template <class Kernel>
int occupancy_max_active_clusters(int device_id) {
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) return 0;
  if (previous != device_id && cudaSetDevice(device_id) != cudaSuccess) return 0;
  const void* fn = reinterpret_cast<const void*>(&cutlass::device_kernel<Kernel>);
  int smem = static_cast<int>(Kernel::SharedStorageSize);
  int clusters = 0;
  if (set_kernel_attributes_once<Kernel>() == cudaSuccess) {
    cudaLaunchConfig_t config = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cute::size<0>(typename Kernel::ClusterShape{});
    attr[0].val.clusterDim.y = cute::size<1>(typename Kernel::ClusterShape{});
    attr[0].val.clusterDim.z = 1;
    config.gridDim = dim3(attr[0].val.clusterDim.x, attr[0].val.clusterDim.y, 1);
    config.blockDim = dim3(Kernel::MaxThreadsPerBlock, 1, 1);
    config.dynamicSmemBytes = smem;
    config.attrs = attr;
    config.numAttrs = 1;
    if (cudaOccupancyMaxActiveClusters(&clusters, fn, &config) != cudaSuccess) clusters = 0;
  }
  cudaGetLastError();  // a failed query must not poison the next launch
  if (previous != device_id) cudaSetDevice(previous);
  return clusters;
}

// sm90: one launch with the cluster attribute and no per-launch attribute
// call, or its description while a LaunchRecording is active; `overlap`
// launches it as a programmatic dependent of the kernel before it. sm100 keeps
// the adapter's own launch (its cluster fallback), which nothing here can run or record.
template <class Gemm>
cudaError_t launch_kernel(typename Gemm::GemmKernel::Params& params, bool overlap,
                          cudaStream_t stream) {
  using Kernel = typename Gemm::GemmKernel;
  if constexpr (Kernel::ArchTag::kMinComputeCapability == 90) {
    using Cluster = typename Kernel::DispatchPolicy::ClusterShape;
    const dim3 cluster(cute::size<0>(Cluster{}), cute::size<1>(Cluster{}),
                       cute::size<2>(Cluster{}));
    auto* kernel = &cutlass::device_kernel<Kernel>;
    if (overlap)
      return launch_or_record_overlapped(kernel, Gemm::get_grid_shape(params),
                                         Kernel::get_block_shape(), cluster,
                                         Kernel::SharedStorageSize, stream, params);
    return launch_or_record(kernel, Gemm::get_grid_shape(params), Kernel::get_block_shape(),
                            cluster, Kernel::SharedStorageSize, stream, params);
  } else {
    if (LaunchRecording* recording = active_launch_recording()) {
      recording->refused = true;
      return cudaSuccess;
    }
    return Gemm::run(params, stream) == cutlass::Status::kSuccess ? cudaGetLastError()
                                                                  : cudaErrorLaunchFailure;
  }
}

// CUTLASS's grouped (pointer-array) kernels; others have no such member.
template <class Kernel, class = void>
struct IsPointerArrayKernel : std::false_type {};
template <class Kernel>
struct IsPointerArrayKernel<Kernel, std::void_t<decltype(Kernel::IsGroupedGemmKernel)>>
    : std::bool_constant<Kernel::IsGroupedGemmKernel> {};

// Mainloops with a load warp of their own besides TMA's (the blockwise-scaled
// ones: B's scales by cp.async), which CUTLASS's kernel starts without
// griddepcontrol.wait.
template <class Kernel>
struct HasAuxiliaryLoad : std::bool_constant<cutlass::gemm::kernel::detail::HasAuxiliaryLoad_v<
                              typename Kernel::CollectiveMainloop::DispatchPolicy>> {};

// Only the stream-K scheduler's arguments choose a decomposition (static,
// split-K or stream-K) at run time.
template <class SchedulerArguments, class = void>
struct ChoosesDecomposition : std::false_type {};
template <class SchedulerArguments>
struct ChoosesDecomposition<SchedulerArguments,
                            std::void_t<decltype(SchedulerArguments::decomposition_mode)>>
    : std::true_type {};

template <class Epilogue, class = void>
struct HasFusionCallbacks : std::false_type {};
template <class Epilogue>
struct HasFusionCallbacks<Epilogue, std::void_t<typename Epilogue::FusionCallbacks>>
    : std::true_type {};

// Whether a launch's workspace initialisation goes through our hooks only.
// Dense kernels: no workspace, or just the work queue's counter (which CUTLASS
// rounds up to its workspace alignment, as it does the epilogue's part, so a
// nonzero epilogue workspace would show as a second unit). sm90 pointer-array
// kernels also keep per-SM copies of their TMA descriptors there, which the
// kernel writes from its Params before its first tile (the array mainloops'
// and epilogue's host-side initialisation does nothing); they are recordable
// when the epilogue's fusion keeps no workspace and the scheduler's part is
// the counter.
template <class Kernel>
bool workspace_recordable(typename Kernel::Arguments const& args) {
  constexpr bool counter =
      std::is_base_of_v<sm90::WorkQueueCounter, typename Kernel::TileScheduler>;
  if constexpr (IsPointerArrayKernel<Kernel>::value &&
                Kernel::ArchTag::kMinComputeCapability == 90) {
    using Epilogue = typename Kernel::CollectiveEpilogue;
    if constexpr (HasFusionCallbacks<Epilogue>::value)
      return counter && Epilogue::FusionCallbacks::get_workspace_size(args.problem_shape,
                                                                      args.epilogue.thread) == 0;
    else  // an epilogue of our own (the gated one), without fusion callbacks
      return counter && Epilogue::get_workspace_size(args.problem_shape, args.epilogue,
                                                     args.hw_info.sm_count) == 0;
  } else {
    constexpr size_t kUnit = cutlass::MinWorkspaceAlignment;
    const size_t bytes = Kernel::get_workspace_size(args);
    return bytes == 0 || (counter && bytes <= (sizeof(uint32_t) + kUnit - 1) / kUnit * kUnit);
  }
}

// Checks, initialises the workspace (stream-ordered) and launches one CUTLASS
// GEMM: the adapter's initialize() and run(), with the function attributes set
// once. Never synchronises, so it is safe inside CUDA graph capture. With
// `kept`, a launch that needs no workspace keeps its Params there under `key`.
template <class Gemm>
const char* initialize_and_run(typename Gemm::Arguments const& args, void* workspace,
                               cudaStream_t stream,
                               KeptParams<typename Gemm::GemmKernel::Params>* kept = nullptr,
                               const ParamsKey* key = nullptr) {
  using Kernel = typename Gemm::GemmKernel;
  if (Gemm::can_implement(args) != cutlass::Status::kSuccess)
    return "CUTLASS cannot implement this problem (alignment or shape)";
  if (set_kernel_attributes_once<Kernel>() != cudaSuccess) {
    cudaGetLastError();
    return "kernel initialisation failed (shared memory or cluster attribute)";
  }
  if (LaunchRecording* recording = active_launch_recording();
      recording != nullptr && !workspace_recordable<Kernel>(args)) {
    recording->refused = true;  // CUTLASS's own initialisation: the call is captured
    return nullptr;
  }
  if (Kernel::initialize_workspace(args, workspace, stream, nullptr) != cutlass::Status::kSuccess)
    return "kernel initialisation failed (workspace)";
  const bool no_workspace = Kernel::get_workspace_size(args) == 0;
  // Kept Params must not point into this call's workspace: they need none.
  const bool keep = kept != nullptr && no_workspace;
  typename Kernel::Params params =
      Kernel::to_underlying_arguments(args, keep ? nullptr : workspace);
  // A dense kernel with no workspace reads and writes global memory only after
  // its griddepcontrol.wait (CUTLASS_ENABLE_GDC_FOR_SM90), so it may start
  // while the kernel before it finishes. A workspace (the work queue's counter,
  // stream-K's partials) is initialised just before the kernel and is read
  // by scheduler code that does not wait; so are the block scales that the
  // blockwise mainloop's auxiliary load warp reads.
  const bool overlap =
      !IsPointerArrayKernel<Kernel>::value && !HasAuxiliaryLoad<Kernel>::value && no_workspace;
  if (cudaError_t err = launch_kernel<Gemm>(params, overlap, stream); err != cudaSuccess) {
    cudaGetLastError();
    return cudaGetErrorString(err);
  }
  if (keep) kept->keep(*key, params);
  return nullptr;
}

// SwapAB: the kernel computes D^T = B^T·A^T, so a small M lands on the MMA's
// N side (wgmma N can be 8..256, while a cooperative M tile is 128). D^T is
// column-major, which is D row-major; LayoutA/LayoutB and the tile are the
// swapped problem's, and GemmProblem keeps the caller's (m, n, a, b).
template <class Row, class Arch, class ElementAB, class ElementD, class LayoutA, class LayoutB,
          class TileShape, class ClusterShape, int Stages, class MainloopSchedule,
          class EpilogueSchedule, class TileScheduler, class Epilogue = PlainEpilogue,
          bool SwapAB = false, class Operands = PlainOperands>
struct CutlassUniversalGemm {
  static constexpr int kAlignAB = 16 / sizeof(typename Operands::template Value<ElementAB>);
  static constexpr int kAlignD = 16 / sizeof(ElementD);
  // bias[n] of the fused epilogue would become a per-row bias of D^T
  static_assert(!(SwapAB && Epilogue::kFused), "swapped variants have the plain epilogue only");
  // the scales are A's rows and B's columns: swapping would swap their tiles
  static_assert(!(SwapAB && Operands::kBlockScaled), "block-scaled variants are not swapped");
  using LayoutD =
      std::conditional_t<SwapAB, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      Arch, typename Operands::OpClass, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      typename Epilogue::template ElementC<ElementD>, LayoutD, kAlignD, ElementD, LayoutD, kAlignD,
      EpilogueSchedule, typename Epilogue::template FusionOp<ElementD>>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      Arch, typename Operands::OpClass, ElementAB, typename Operands::template LayoutA<LayoutA>,
      kAlignAB, ElementAB, typename Operands::template LayoutB<LayoutB>, kAlignAB, float, TileShape,
      ClusterShape,
      typename Operands::template StageCount<
          Stages, static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;
  static_assert(CollectiveMainloop::DispatchPolicy::Stages == Stages,
                "the mainloop's pipeline has another stage count than the menu row names");

  using Kernel = RowKernel<
      Row, cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, CollectiveMainloop,
                                                CollectiveEpilogue, TileScheduler>>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static_assert(Kernel::SharedStorageSize <= 227 * 1024,
                "variant does not fit in shared memory: lower its stages in variants.json");
  static constexpr bool kHasStreamK =
      ChoosesDecomposition<typename Kernel::TileScheduler::Arguments>::value;
  // Params that depend on the buffers only through the TMA descriptors of A,
  // B and D (kernels/kept_params.h); a problem that needs a workspace is
  // never kept.
  static constexpr bool kKeepsParams =
      Kernel::ArchTag::kMinComputeCapability == 90 && !IsPointerArrayKernel<Kernel>::value &&
      !HasAuxiliaryLoad<Kernel>::value && !Epilogue::kFused && !Operands::kBlockScaled;
  using Params = typename Kernel::Params;

  static typename Gemm::Arguments arguments(const GemmProblem& p, const LaunchChoices& c,
                                            const DeviceSlots& s) {
    using cute::make_shape;
    const int m = SwapAB ? p.n : p.m, n = SwapAB ? p.m : p.n;
    const void* a = SwapAB ? p.b : p.a;
    const void* b = SwapAB ? p.a : p.b;
    auto sa =
        cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, make_shape(m, p.k, p.batch));
    auto sb =
        cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, make_shape(n, p.k, p.batch));
    auto sd =
        cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, make_shape(m, n, p.batch));
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {m, n, p.k, p.batch},
        Operands::template mainloop<CollectiveMainloop, ElementAB>(p, m, n, a, sa, b, sb),
        {{}, nullptr, sd, static_cast<ElementD*>(p.d), sd}};
    const EpilogueArgs& e = p.epilogue;
    args.epilogue.thread.alpha = e.alpha;
    args.epilogue.thread.beta = e.beta;
    if constexpr (Epilogue::kFused) {
      // Without C, D stands in: beta is 0 then, and CUTLASS skips C's loads.
      args.epilogue.ptr_C = static_cast<const ElementD*>(e.c != nullptr ? e.c : p.d);
      args.epilogue.thread.bias_ptr = static_cast<const ElementD*>(e.bias);
      args.epilogue.thread.activation.activation = e.activation;
    }
    args.hw_info.device_id = s.device_id;
    args.hw_info.sm_count = s.sm_count;
    args.hw_info.max_active_clusters = s.max_active_clusters;
    using RasterOrder = cutlass::gemm::kernel::detail::RasterOrderOptions;
    args.scheduler.max_swizzle_size = c.swizzle;
    // the Plan's raster names the caller's M and N
    args.scheduler.raster_order =
        (c.raster == Raster::kAlongM) != SwapAB ? RasterOrder::AlongM : RasterOrder::AlongN;
    if constexpr (kHasStreamK) {
      using Mode = cutlass::gemm::kernel::detail::DecompositionMode;
      args.scheduler.reduction_mode = cutlass::gemm::kernel::detail::ReductionMode::Deterministic;
      args.scheduler.splits = c.schedule == Schedule::kSplitK ? c.splits : 1;
      args.scheduler.decomposition_mode = c.schedule == Schedule::kStreamK  ? Mode::StreamK
                                          : c.schedule == Schedule::kSplitK ? Mode::SplitK
                                                                            : Mode::DataParallel;
    }
    return args;
  }

  static size_t workspace_size(const GemmProblem& p, const LaunchChoices& c, const DeviceSlots& s) {
    return Gemm::get_workspace_size(arguments(p, c, s));
  }

  static const char* run(const GemmProblem& p, const LaunchChoices& c, const DeviceSlots& s,
                         void* workspace, size_t workspace_bytes, cudaStream_t stream) {
    // The dispatcher has matched the schedule to the variant's kind; only the
    // stream-K scheduler reads it at run time.
    if (!kHasStreamK && (c.schedule == Schedule::kStreamK || c.schedule == Schedule::kSplitK))
      return "stream-K and split-K need the stream-K scheduler, which this variant lacks";
    if (!Epilogue::kFused && !p.epilogue.is_identity())
      return "this variant has no fused epilogue (bias, activation, C)";
    if (!Operands::has_scales(p)) return "a block-scaled variant needs the scales of A and B";
    if (p.epilogue.beta != 0.0f && p.epilogue.c == nullptr) return "beta is not 0 but C is missing";
    if constexpr (kKeepsParams) {
      const ParamsKey key = ParamsKey::of(p, c, s);
      if (const Params* kept = kept_params().find(key)) {
        Params params = *kept;
        if (repoint(params, p)) {
          count_kept_params(true);
          if (cudaError_t err = launch_kernel<Gemm>(params, /*overlap=*/true, stream);
              err != cudaSuccess) {
            cudaGetLastError();
            return cudaGetErrorString(err);
          }
          return nullptr;
        }
      }
      auto args = arguments(p, c, s);
      if (Gemm::get_workspace_size(args) > workspace_bytes)
        return "workspace buffer is smaller than the variant needs";
      return initialize_and_run<Gemm>(args, workspace, stream, &kept_params(), &key);
    } else {
      auto args = arguments(p, c, s);
      if (Gemm::get_workspace_size(args) > workspace_bytes)
        return "workspace buffer is smaller than the variant needs";
      return initialize_and_run<Gemm>(args, workspace, stream);
    }
  }

  // This kernel's kept Params on this host thread.
  static KeptParams<Params>& kept_params() {
    thread_local KeptParams<Params> kept;
    return kept;
  }

  // Moves kept Params to the call's buffers (A and B as the kernel reads them).
  static bool repoint(Params& params, const GemmProblem& p) {
    return replace_tma_address(params.mainloop.tma_load_a.get_tma_descriptor(),
                               SwapAB ? p.b : p.a) &&
           replace_tma_address(params.mainloop.tma_load_b.get_tma_descriptor(),
                               SwapAB ? p.a : p.b) &&
           replace_tma_address(params.epilogue.tma_store_d.get_tma_descriptor(), p.d);
  }

  static int max_active_clusters(int device_id) {
    return occupancy_max_active_clusters<Kernel>(device_id);
  }

  static constexpr VariantOps ops{&workspace_size, &run, &max_active_clusters};
};

}  // namespace jax_cluster
