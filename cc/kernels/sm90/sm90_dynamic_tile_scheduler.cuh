// Dynamic persistent tile scheduling for CUTLASS's sm90 warp-specialized
// cooperative kernel: the Hopper analogue of Blackwell's Cluster Launch Control.
//
// Each persistent cluster starts on its own static tile; after that the
// leader CTA's scheduler warp takes the next cluster tile from one global
// counter (atomicAdd, once per cluster) and writes it into every CTA's shared
// memory with st.async, completing each CTA's mbarrier transaction. All warps
// of all CTAs in the cluster read the same slot, so they agree on the tile
// without a second fetch. The counter lives in the launch workspace and is
// zeroed by a stream-ordered memset before every launch (no host sync, safe
// in CUDA graphs). Each tile is computed whole by one cluster in a fixed
// K order, so results are bit-identical whichever cluster takes it. Queue
// indices name cluster tiles in ClusterTileOrder's padding-free banded walk
// (the Plan's raster and swizzle), not CUTLASS's padded swizzle.
//
// The kernel hooks used here (scheduler warp, throttle and scheduler
// pipelines) are CUTLASS's; CUTLASS ships no sm90 scheduler that uses them.
#pragma once

#include <cstdint>

#include <cute/arch/cluster_sm90.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/gemm/kernel/tile_scheduler.hpp>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "common/cluster_tile_order.h"
#include "kernels/sm90/work_queue_counter.cuh"

namespace jax_cluster::sm90 {

// Tag selecting DynamicTileScheduler in a CUTLASS GemmUniversal.
struct DynamicPersistentScheduler {};

// One slot per stage holding a cluster-tile index. Only the producer CTA
// (rank 0) writes; every CTA's consumer warps read their own copy and release
// the slot on the producer CTA's empty barrier, once per warp.
template <int Stages_>
class ClusterBroadcastPipeline {
 public:
  static constexpr uint32_t Stages = Stages_;
  using PipelineState = cutlass::PipelineState<Stages>;
  enum class ThreadCategory { NonParticipant, Producer, Consumer, ProducerConsumer };

  struct SharedStorage {
    cutlass::arch::ClusterTransactionBarrier full[Stages];
    cutlass::arch::ClusterBarrier empty[Stages];
  };

  // Field names are the ones CUTLASS's kernel fills in; consumer_arv_count
  // is in threads of one CTA.
  struct Params {
    uint32_t transaction_bytes = 0;
    ThreadCategory role = ThreadCategory::NonParticipant;
    uint32_t producer_blockid = 0;
    uint32_t producer_arv_count = 1;
    uint32_t consumer_arv_count = 0;
    int initializing_warp = 0;
  };

  CUTLASS_DEVICE ClusterBroadcastPipeline(SharedStorage& storage, Params const& params)
      : storage_(storage), params_(params) {
    auto cs = cute::cluster_shape();
    cluster_size_ = cs.x * cs.y * cs.z;
    is_producer_cta_ = cute::block_rank_in_cluster() == params.producer_blockid;
    if (cutlass::canonical_warp_idx_sync() == params.initializing_warp && cute::elect_one_sync()) {
      // Consumers release once per warp, from every CTA of the cluster.
      uint32_t release_count =
          params.consumer_arv_count / cutlass::NumThreadsPerWarp * cluster_size_;
      for (uint32_t s = 0; s < Stages; ++s) {
        storage.full[s].init(1);
        storage.empty[s].init(release_count);
      }
    }
    cutlass::arch::fence_barrier_init();
  }

  CUTLASS_DEVICE bool is_producer_cta() const { return is_producer_cta_; }
  CUTLASS_DEVICE uint32_t cluster_size() const { return cluster_size_; }

  // Producer CTA, whole warp: wait until every CTA released the slot, then
  // arm each CTA's full barrier (lane c arms CTA c) for the incoming bytes.
  CUTLASS_DEVICE void producer_acquire(PipelineState state) {
    storage_.empty[state.index()].wait(state.phase());
    uint32_t lane = cutlass::canonical_lane_idx();
    storage_.full[state.index()].arrive_and_expect_tx(params_.transaction_bytes, lane,
                                                      uint32_t(lane < cluster_size_));
  }

  // Shared-memory address of this CTA's full barrier; st.async maps it to a peer.
  CUTLASS_DEVICE uint32_t full_barrier_address(uint32_t stage) const {
    return cute::cast_smem_ptr_to_uint(&storage_.full[stage]);
  }

  // The producer CTA must outlive every remote release aimed at it.
  CUTLASS_DEVICE void producer_tail(PipelineState state) {
    if (!is_producer_cta_) return;
    for (uint32_t i = 0; i < Stages; ++i, ++state)
      storage_.empty[state.index()].wait(state.phase());
  }

  CUTLASS_DEVICE void consumer_wait(PipelineState state) {
    storage_.full[state.index()].wait(state.phase());
  }

  // Whole warp: every lane has read the slot before lane 0 releases it.
  CUTLASS_DEVICE void consumer_release(PipelineState state) {
    __syncwarp();
    if (cutlass::canonical_lane_idx() == 0)
      storage_.empty[state.index()].arrive(params_.producer_blockid);
  }

 private:
  SharedStorage& storage_;
  Params params_;
  uint32_t cluster_size_ = 1;
  bool is_producer_cta_ = false;
};

// The throttle pairs each CTA's mainloop producer with its own scheduler warp:
// the next tile is fetched only once the current one starts loading, so a
// cluster never holds more than one tile in reserve. CUTLASS's kernel aims
// releases at CTA 0; here every CTA keeps its own.
template <int Stages_>
class CtaLocalThrottle : public cutlass::PipelineAsync<Stages_> {
  using Base = cutlass::PipelineAsync<Stages_>;

 public:
  using typename Base::Params;
  CUTLASS_DEVICE CtaLocalThrottle(typename Base::SharedStorage& storage, Params params)
      : Base(storage, local(params)) {}

 private:
  CUTLASS_DEVICE static Params local(Params p) {
    p.dst_blockid = cute::block_rank_in_cluster();
    return p;
  }
};

template <int Stages_ = 2>
class DynamicTileScheduler : public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90,
                             public WorkQueueCounter {
  using Static = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90;

 public:
  static constexpr bool IsDynamicPersistent = true;
  using Pipeline = ClusterBroadcastPipeline<Stages_>;
  using ThrottlePipeline = CtaLocalThrottle<Stages_>;
  using WorkTileInfo = typename Static::WorkTileInfo;
  using Arguments = typename Static::Arguments;

  struct CLCResponse {  // the broadcast payload: one cluster-tile index
    uint32_t cluster_tile;
  };

  using QueueParams = WorkQueueParams<typename Static::Params>;
  struct Params : QueueParams {
    ClusterTileOrder order;
  };

  class SharedStorage {
   public:
    CUTLASS_DEVICE typename Pipeline::SharedStorage& pipeline() { return pipeline_; }
    CUTLASS_DEVICE typename ThrottlePipeline::SharedStorage& throttle_pipeline() {
      return throttle_;
    }
    CUTLASS_DEVICE CLCResponse* data() { return data_; }

   private:
    alignas(16) typename Pipeline::SharedStorage pipeline_;
    alignas(16) typename ThrottlePipeline::SharedStorage throttle_;
    alignas(16) CLCResponse data_[Stages_];
  };

  template <class ProblemShapeMNKL, class TileShape, class ClusterShape>
  static Params to_underlying_arguments(ProblemShapeMNKL problem, TileShape tile,
                                        ClusterShape cluster, cutlass::KernelHardwareInfo const& hw,
                                        Arguments const& args, void* workspace = nullptr,
                                        uint32_t epilogue_subtile = 1, uint32_t = 1u) {
    auto base = Static::to_underlying_arguments(problem, tile, cluster, hw, args, workspace,
                                                epilogue_subtile);
    auto ceil_div = [](uint32_t a, uint32_t b) { return (a + b - 1) / b; };
    const uint32_t cm = cute::size<0>(cluster), cn = cute::size<1>(cluster);
    Params p;
    static_cast<QueueParams&>(p) = QueueParams::with_counter(base, workspace);
    p.order =
        ClusterTileOrder::make(ceil_div(ceil_div(cute::get<0>(problem), cute::size<0>(tile)), cm),
                               ceil_div(ceil_div(cute::get<1>(problem), cute::size<1>(tile)), cn),
                               uint32_t(cute::get<3>(problem)), uint32_t(args.max_swizzle_size),
                               base.raster_order_ == RasterOrder::AlongN);
    return p;
  }

  using WorkQueueCounter::get_workspace_size;
  using WorkQueueCounter::initialize_workspace;

  CUTLASS_HOST_DEVICE DynamicTileScheduler() {}

  CUTLASS_DEVICE explicit DynamicTileScheduler(Params const& params)
      : Static(params), tile_counter_(params.tile_counter), order_(params.order) {
#if defined(__CUDA_ARCH__)
    auto grid = cute::cluster_grid_dims();
    auto cluster = cute::cluster_id_in_grid();
    launched_cluster_tiles_ = grid.x * grid.y * grid.z;
    first_cluster_tile_ = cluster.x + grid.x * (cluster.y + grid.y * cluster.z);
#endif
  }

  // Every role's first tile: the launched clusters take queue indices
  // 0..launched-1; the counter hands out the rest.
  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape) const {
    return work_for(first_cluster_tile_);
  }

  CUTLASS_DEVICE void set_data_ptr(CLCResponse* data) { data_ = data; }

  // Scheduler warp of every CTA; only the producer CTA fetches.
  template <class Pipe, class State>
  CUTLASS_DEVICE State advance_to_next_work(Pipe& pipeline, State state) {
    if (pipeline.is_producer_cta()) {
      pipeline.producer_acquire(state);
      uint32_t lane = cutlass::canonical_lane_idx();
      uint32_t next = 0;
      if (lane == 0) next = launched_cluster_tiles_ + atomicAdd(tile_counter_, 1u);
      next = __shfl_sync(0xffffffff, next, 0);
      if (lane < pipeline.cluster_size()) {
        cute::store_shared_remote(next, cute::cast_smem_ptr_to_uint(&data_[state.index()]),
                                  pipeline.full_barrier_address(state.index()), lane);
      }
    }
    ++state;
    return state;
  }

  // Every looping warp of every CTA: read the broadcast tile, release the slot.
  template <class Pipe, class State>
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo, Pipe& pipeline, State state) {
    pipeline.consumer_wait(state);
    asm volatile("" ::: "memory");  // the barrier wait has no memory clobber
    uint32_t cluster_tile = data_[state.index()].cluster_tile;
    pipeline.consumer_release(state);
    return cute::make_tuple(work_for(cluster_tile), true);
  }

  // Asked after each tile's mainloop to release the next kernel early
  // (CUTLASS_ENABLE_GDC_FOR_SM90): which tile is a CTA's last is known only
  // when the queue runs dry, so the release comes with the grid's exit.
  CUTLASS_DEVICE bool is_last_tile(WorkTileInfo const&, uint32_t = 1) const { return false; }

  // The kernel calls this only for warp groups without work in a tile, which
  // this scheduler never produces; ending the loop is the safe answer.
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo) {
    return cute::make_tuple(WorkTileInfo::invalid_work_tile(), true);
  }

 private:
  // This CTA's tile of cluster tile `index` in the walk.
  CUTLASS_DEVICE WorkTileInfo work_for(uint64_t index) const {
    ClusterTile t = order_.at(index);
    if (!t.valid) return WorkTileInfo::invalid_work_tile();
    auto cta = cute::block_id_in_cluster();
    auto cs = cute::cluster_shape();
    return {int32_t(t.m * cs.x + cta.x), int32_t(t.n * cs.y + cta.y), int32_t(t.l), true};
  }

  uint32_t* tile_counter_ = nullptr;
  CLCResponse* data_ = nullptr;
  ClusterTileOrder order_;
  uint32_t launched_cluster_tiles_ = 0;
  uint32_t first_cluster_tile_ = 0;
};

}  // namespace jax_cluster::sm90

namespace cutlass::gemm::kernel::detail {

// CUTLASS's kernel asks this selector for the scheduler class of a tag.
template <class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<jax_cluster::sm90::DynamicPersistentScheduler, arch::Sm90, TileShape,
                             ClusterShape, SchedulerPipelineStageCount> {
  using Scheduler = jax_cluster::sm90::DynamicTileScheduler<2>;
};

}  // namespace cutlass::gemm::kernel::detail
