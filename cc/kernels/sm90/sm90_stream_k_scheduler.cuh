// CUTLASS's sm90 stream-K scheduler (data-parallel, split-K or stream-K, as
// the Plan says) under a tag of our own, so that it compiles with grid
// dependency control built in: there the kernel asks the scheduler whether a
// tile is the CTA's last, and CUTLASS 4.2's answer binds a member of its
// const self to a non-const reference. The answer is only a hint to launch
// the next kernel early; "never" leaves that signal to the kernel's exit.
#pragma once

#include <cstdint>

#include <cutlass/cutlass.h>
#include <cutlass/gemm/kernel/tile_scheduler.hpp>

namespace jax_cluster::sm90 {

// Tag selecting StreamKTileScheduler in a CUTLASS GemmUniversal.
struct StreamKScheduler {};

template <class TileShape, class ClusterShape>
class StreamKTileScheduler
    : public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90StreamK<TileShape,
                                                                                 ClusterShape> {
  using Base =
      cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90StreamK<TileShape, ClusterShape>;

 public:
  using Base::Base;

  CUTLASS_DEVICE bool is_last_tile(typename Base::WorkTileInfo, uint32_t = 1) const {
    return false;
  }
};

}  // namespace jax_cluster::sm90

namespace cutlass::gemm::kernel::detail {

template <class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<jax_cluster::sm90::StreamKScheduler, arch::Sm90, TileShape,
                             ClusterShape, SchedulerPipelineStageCount> {
  using Scheduler = jax_cluster::sm90::StreamKTileScheduler<TileShape, ClusterShape>;
};

}  // namespace cutlass::gemm::kernel::detail
