#include "kernels/launch_recording.h"

namespace jax_cluster {

LaunchRecording*& active_launch_recording() {
  thread_local LaunchRecording* recording = nullptr;
  return recording;
}

}  // namespace jax_cluster
