// Dynamic scheduling over the tiles of all groups of a grouped GEMM, for
// CUTLASS's sm90 pointer-array cooperative kernel.
//
// CUTLASS's group scheduler walks a fixed grid stride through the groups'
// tiles. Here the scheduler warp of each persistent CTA instead takes the
// next linear tile from one global counter (atomicAdd) just before the CTA
// needs it, and maps it to (group, m, n) with CUTLASS's group walk (which
// only moves forward; our indices only grow). Uneven groups then spread over
// the CTAs that free up first instead of the ones the stride picked.
//
// Clusters are 1x1: with ragged groups a cluster of M tiles would straddle
// groups, and the scheduler warp writes only its own CTA's pipeline.
// The counter lives in the launch workspace, zeroed by a stream-ordered
// memset before each launch. Each tile is computed whole by one CTA in a
// fixed K order, so results are bit-identical run to run.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/tile_scheduler.hpp>

#include "kernels/sm90/work_queue_counter.cuh"

namespace jax_cluster::sm90 {

// A distinct problem-shape type so that CUTLASS's scheduler selector picks
// DynamicGroupScheduler instead of its static group scheduler.
struct RaggedProblemShape : cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>> {};

// One tile in reserve per CTA: enough to hide the fetch behind the current
// tile, few enough that the tail stays balanced.
inline constexpr int kGroupSchedulerStages = 2;

template <class GroupProblemShape>
class DynamicGroupScheduler
    : public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Group<GroupProblemShape,
                                                                             kGroupSchedulerStages>,
      public WorkQueueCounter {
  using Static =
      cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Group<GroupProblemShape,
                                                                      kGroupSchedulerStages>;

 public:
  using typename Static::Arguments;
  using typename Static::SchedulerResponse;
  using typename Static::WorkTileInfo;

  using Params = WorkQueueParams<typename Static::Params>;

  template <class TileShape, class ClusterShape>
  static Params to_underlying_arguments(GroupProblemShape problem, TileShape tile,
                                        ClusterShape cluster, cutlass::KernelHardwareInfo const& hw,
                                        Arguments const& args, void* workspace = nullptr,
                                        uint32_t epilogue_subtile = 1, uint32_t = 1u) {
    static_assert(cute::size(ClusterShape{}) == 1, "the dynamic group scheduler runs 1x1 clusters");
    return Params::with_counter(Static::to_underlying_arguments(problem, tile, cluster, hw, args,
                                                                workspace, epilogue_subtile),
                                workspace);
  }

  using WorkQueueCounter::get_workspace_size;
  using WorkQueueCounter::initialize_workspace;

  DynamicGroupScheduler() = default;

  CUTLASS_DEVICE DynamicGroupScheduler(Params const& params, SchedulerResponse* response)
      : Static(params, response), tile_counter_(params.tile_counter) {
#if defined(__CUDA_ARCH__)
    launched_ctas_ = gridDim.x * gridDim.y * gridDim.z;
#endif
  }

  // Scheduler warp, whole warp: wait for a free slot, then fetch, so the
  // tile is claimed as late as possible.
  template <class Pipe, class State>
  CUTLASS_DEVICE auto advance_to_next_work(Pipe& pipeline, State state, uint32_t = 1) {
    pipeline.producer_acquire(state);
    uint32_t lane = cutlass::canonical_lane_idx();
    uint32_t next = 0;
    if (lane == 0) next = launched_ctas_ + atomicAdd(tile_counter_, 1u);
    next = __shfl_sync(0xffffffff, next, 0);
    WorkTileInfo work = this->get_current_work_for_linear_idx(next);  // needs the whole warp
    if (lane == 0) {
      this->response_ptr_[state.index()] = work;
      cutlass::arch::fence_view_async_shared();
      pipeline.producer_commit(state);
    }
    return cute::make_tuple(work, true);
  }

 private:
  uint32_t* tile_counter_ = nullptr;
  uint32_t launched_ctas_ = 0;
};

}  // namespace jax_cluster::sm90

namespace cutlass::gemm::kernel::detail {

template <class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<GroupScheduler, arch::Sm90, TileShape, ClusterShape,
                             SchedulerPipelineStageCount, jax_cluster::sm90::RaggedProblemShape> {
  using Scheduler = jax_cluster::sm90::DynamicGroupScheduler<jax_cluster::sm90::RaggedProblemShape>;
};

}  // namespace cutlass::gemm::kernel::detail
