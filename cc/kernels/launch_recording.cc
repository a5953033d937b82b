#include "kernels/launch_recording.h"

#include <cstdlib>
#include <cstring>

namespace jax_cluster {

LaunchRecording*& active_launch_recording() {
  thread_local LaunchRecording* recording = nullptr;
  return recording;
}

bool pdl_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("JAX_CLUSTER_PDL");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

}  // namespace jax_cluster
