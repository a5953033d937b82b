// The launches a call site's record stage described, kept for the last few
// sets of buffers it saw. XLA updates a recorded node whenever a buffer it
// reads or writes moves, and a jit's outputs and temporaries often move
// between a few addresses from call to call; an update with buffers seen
// before hands over the kept parameters instead of describing the launches
// again (CUTLASS's argument conversion and its TMA descriptors), our share of
// the update's host cost.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "common/gemm_problem.h"
#include "kernels/launch_recording.h"

namespace jax_cluster {

class RecordedLaunches {
 public:
  // Everything a call site's launches depend on that can differ between its
  // calls: the device, the problem's extents and every buffer's address.
  using Key = std::array<uintptr_t, 20>;

  static Key key_of(int device_id, const GemmProblem& p, const void* workspace,
                    size_t workspace_bytes) {
    // a field added to GemmProblem joins the key
    static_assert(sizeof(GemmProblem) == 112, "GemmProblem changed: extend the key");
    uint32_t alpha = 0, beta = 0;
    std::memcpy(&alpha, &p.epilogue.alpha, sizeof alpha);
    std::memcpy(&beta, &p.epilogue.beta, sizeof beta);
    auto at = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr); };
    return {uintptr_t(device_id),
            uintptr_t(uint32_t(p.m)),
            uintptr_t(uint32_t(p.n)),
            uintptr_t(uint32_t(p.k)),
            uintptr_t(uint32_t(p.batch)),
            at(p.a),
            at(p.b),
            at(p.d),
            at(p.group_sizes),
            at(p.epilogue.bias),
            at(p.epilogue.c),
            alpha,
            beta,
            uintptr_t(p.epilogue.activation),
            at(p.scale_a),
            at(p.scale_b),
            at(p.mx_scale_a),
            at(p.mx_scale_b),
            at(workspace),
            uintptr_t(workspace_bytes)};
  }

  // Copies the launches kept for `key` into `out`; false when none are.
  bool find(const Key& key, LaunchRecording* out) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Entry& e : entries_) {
      if (e.count == 0 || e.key != key) continue;  // count 0: nothing kept there yet
      for (int i = 0; i < e.count; ++i) out->steps[i] = e.steps[i];
      out->count = e.count;
      out->used = e.bytes.size();
      std::memcpy(out->bytes, e.bytes.data(), e.bytes.size());
      return true;
    }
    return false;
  }

  // Keeps a complete recording for `key`, in place of the oldest kept.
  void keep(const Key& key, const LaunchRecording& r) {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = entries_[next_];
    next_ = (next_ + 1) % kEntries;
    e.key = key;
    e.count = r.count;
    for (int i = 0; i < r.count; ++i) e.steps[i] = r.steps[i];
    e.bytes.assign(r.bytes, r.bytes + r.used);
  }

 private:
  static constexpr int kEntries = 4;
  struct Entry {
    Key key{};
    int count = 0;
    std::array<RecordedStep, LaunchRecording::kMaxSteps> steps;
    std::vector<unsigned char> bytes;
  };
  mutable std::mutex mu_;
  std::array<Entry, kEntries> entries_;
  int next_ = 0;
};

}  // namespace jax_cluster
