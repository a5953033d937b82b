// CUTLASS's sm90 stream-K scheduler (which also runs the static and split-K
// walks) with an early release of the next kernel.
//
// Built with CUTLASS_ENABLE_GDC_FOR_SM90, CUTLASS's cooperative kernel asks
// its scheduler after each tile's mainloop whether that tile is the CTA's
// last, and if so signals griddepcontrol.launch_dependents: a kernel launched
// as its programmatic dependent starts its prologue on the SMs this one frees
// while the last epilogues run, and waits (griddepcontrol.wait) for this grid
// to finish before touching memory. CUTLASS 4.2's stream-K is_last_tile does
// not compile (a const member passes its own unit_iter_start_ to a function
// that takes a mutable reference); this one asks a copy of the scheduler.
#pragma once

#include <cstdint>

#include <cutlass/gemm/kernel/tile_scheduler.hpp>

namespace jax_cluster::sm90 {

// Tag selecting StreamKReleaseScheduler in a CUTLASS GemmUniversal.
struct StreamKRelease {};

template <class TileShape, class ClusterShape>
class StreamKReleaseScheduler
    : public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90StreamK<TileShape,
                                                                               ClusterShape> {
  using Base =
      cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90StreamK<TileShape, ClusterShape>;

 public:
  using Base::Base;

  // Whether this CTA has no work after `work` (taken by value: continuing a
  // stream-K unit updates it). A hint only: answering wrong costs time, not
  // correctness, since dependents still wait for the whole grid.
  CUTLASS_DEVICE bool is_last_tile(typename Base::WorkTileInfo work,
                                   uint32_t advance_count = 1) const {
    if (Base::continue_current_work(work)) return false;
    Base next = *this;
    next.advance_to_next_work(advance_count);
    return !next.get_current_work().is_valid();
  }
};

}  // namespace jax_cluster::sm90

namespace cutlass::gemm::kernel::detail {

template <class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<jax_cluster::sm90::StreamKRelease, arch::Sm90, TileShape, ClusterShape,
                             SchedulerPipelineStageCount> {
  using Scheduler = jax_cluster::sm90::StreamKReleaseScheduler<TileShape, ClusterShape>;
};

}  // namespace cutlass::gemm::kernel::detail
