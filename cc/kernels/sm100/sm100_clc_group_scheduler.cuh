// Cluster Launch Control scheduling over the tiles of all groups of a grouped
// GEMM, for CUTLASS's sm100 pointer-array kernel.
//
// CUTLASS schedules grouped GEMMs statically because the tile count lives on
// the device. Here the host launches one cluster per cluster tile of an upper
// bound on that count (from M, N, G: see Sm100GroupedGemm::bound_clusters),
// and running clusters cancel not-yet-launched ones with CUTLASS's own CLC
// query (the inherited advance_to_next_work). A cluster id, whether it is the
// cluster's own or one CLC handed over, is mapped to (group, m, n) through
// tile_start, the device-side exclusive scan of cluster tiles per group
// (ragged_groups.cuh). The mapping is stateless, so it is correct in whatever
// order CLC returns ids; ids past the last real tile are slack and end the
// cluster (a launched slack cluster exits before it allocates anything).
//
// Contract: cluster (ClusterM, 1, 1) over a 1-D grid of ClusterM * bound CTAs;
// a cluster tile is ClusterM CTA tiles along M, column tiles run fastest.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/fast_math.h>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/sm100_tile_scheduler.hpp>
#include <cutlass/gemm/kernel/tile_scheduler.hpp>

namespace jax_cluster::sm100 {

// A distinct problem-shape type so that CUTLASS's scheduler selector picks
// ClcGroupScheduler instead of its static sm100 group scheduler.
struct RaggedClcShape : cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>> {};

// The base part keeps CUTLASS's CLC code paths well-defined; the kernel reads
// only ours for the mapping.
struct ClcGroupParams : cutlass::gemm::kernel::detail::PersistentTileSchedulerSm100Params {
  const int32_t* tile_start = nullptr;  // [groups + 1], on the device
  int32_t groups = 0;
  int32_t bound_clusters = 0;
  cutlass::FastDivmod divmod_tiles_n{};
};

template <class ClusterShape, uint32_t Stages>
class ClcGroupScheduler
    : public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm100<ClusterShape, Stages> {
  using Base = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm100<ClusterShape, Stages>;
  static constexpr int kClusterM = cute::size<0>(ClusterShape{});
  static_assert(cute::size<1>(ClusterShape{}) == 1 && cute::size<2>(ClusterShape{}) == 1,
                "the CLC group scheduler takes clusters along M only");

 public:
  using typename Base::CLCResponse;
  using typename Base::WorkTileInfo;
  using Params = ClcGroupParams;

  struct Arguments : Base::Arguments {
    const int32_t* tile_start = nullptr;
    int32_t bound_clusters = 0;  // clusters launched: an upper bound on the cluster tiles
    int32_t tiles_n = 0;
  };

  template <class TileShape, class AtomThrShape, class Cluster>
  static Params to_underlying_arguments(RaggedClcShape problem, TileShape, AtomThrShape, Cluster,
                                        cutlass::KernelHardwareInfo const& hw,
                                        Arguments const& args, void* = nullptr) {
    Params params;
    params.initialize(dim3(kClusterM * args.bound_clusters, 1, 1),
                      cutlass::gemm::GemmCoord(kClusterM, 1, 1), hw, /*max_swizzle_size=*/1,
                      Base::RasterOrderOptions::AlongM);
    params.tile_start = args.tile_start;
    params.groups = problem.num_groups;
    params.bound_clusters = args.bound_clusters;
    params.divmod_tiles_n = cutlass::FastDivmod(args.tiles_n);
    return params;
  }

  template <class Problem, class TileShape, class AtomThrShape, class Cluster>
  static dim3 get_grid_shape(Params const& params, Problem const&, TileShape, AtomThrShape, Cluster,
                             cutlass::KernelHardwareInfo const&) {
    return dim3(kClusterM * params.bound_clusters, 1, 1);
  }

  // No scheduler workspace: tile_start belongs to the caller's workspace.
  template <class ProblemShape, class ElementAccumulator>
  static size_t get_workspace_size(Arguments const&, ProblemShape,
                                   cutlass::KernelHardwareInfo const&, uint32_t, uint32_t = 1,
                                   uint32_t = 1) {
    return 0;
  }

  template <class ProblemShape, class ElementAccumulator>
  static cutlass::Status initialize_workspace(Arguments const&, void*, cudaStream_t,
                                              ProblemShape const&,
                                              cutlass::KernelHardwareInfo const&, uint32_t,
                                              uint32_t = 1, uint32_t = 1,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  static bool can_implement(Arguments const& args) {
    return args.tile_start != nullptr && args.bound_clusters > 0 && args.tiles_n > 0;
  }

  CUTLASS_DEVICE ClcGroupScheduler(CLCResponse* response, Params const& params,
                                   dim3 block_id_in_cluster)
      : Base(response, params, block_id_in_cluster),
        tile_start_(params.tile_start),
        groups_(params.groups),
        divmod_tiles_n_(params.divmod_tiles_n) {}

  // Every warp of the CTA, before role dispatch: this cluster's own id.
  template <class Cluster>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(Cluster) {
    return decode(static_cast<int32_t>(blockIdx.x) / kClusterM);
  }

  // Reads the CLC response CUTLASS's query left in this stage and maps it.
  template <class Pipeline, class PipelineState>
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo, Pipeline& pipeline, PipelineState state) {
    pipeline.consumer_wait(state);
    uint32_t addr = cute::cast_smem_ptr_to_uint(&this->clc_response_ptr_[state.index()]);
    WorkTileInfo cancelled = Base::work_tile_info_from_clc_response(addr);
    pipeline.consumer_release(state);
    WorkTileInfo next = cancelled.is_valid() ? decode(cancelled.M_idx / kClusterM)
                                             : WorkTileInfo::invalid_work_tile();
    return cute::make_tuple(next, true);
  }

 private:
  // Cluster id -> this CTA's tile; invalid for slack ids. The last group's
  // range is cached, the rest is a binary search for the largest g with
  // tile_start[g] <= id (empty groups share their successor's start).
  CUTLASS_DEVICE WorkTileInfo decode(int32_t id) {
    if (id >= tile_start_[groups_]) return WorkTileInfo::invalid_work_tile();
    if (id < group_lo_ || id >= group_hi_) {
      int lo = 0, hi = groups_;  // tile_start[lo] <= id < tile_start[hi]
      while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (tile_start_[mid] <= id) lo = mid;
        else hi = mid;
      }
      group_ = lo;
      group_lo_ = tile_start_[lo];
      group_hi_ = tile_start_[lo + 1];
    }
    int m_cluster, n;
    divmod_tiles_n_(m_cluster, n, id - group_lo_);
    return {m_cluster * kClusterM + static_cast<int32_t>(this->block_id_in_cluster_.x), n, group_,
            true};
  }

  const int32_t* tile_start_;
  int32_t groups_;
  cutlass::FastDivmod divmod_tiles_n_;
  int32_t group_ = 0, group_lo_ = 0, group_hi_ = 0;  // empty range: the first id searches
};

}  // namespace jax_cluster::sm100

namespace cutlass::gemm::kernel::detail {

template <class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<GroupScheduler, arch::Sm100, TileShape, ClusterShape,
                             SchedulerPipelineStageCount, jax_cluster::sm100::RaggedClcShape> {
  using Scheduler =
      jax_cluster::sm100::ClcGroupScheduler<ClusterShape, SchedulerPipelineStageCount>;
};

}  // namespace cutlass::gemm::kernel::detail
