#include "kernels/fill.h"

#include <algorithm>
#include <cstdint>

#include "kernels/launch_recording.h"

namespace jax_cluster {
namespace {

constexpr int kFillThreads = 256;

// 16 bytes a store between the unaligned head and tail.
__global__ void fill_bytes(unsigned char* at, size_t bytes, unsigned char value) {
  const size_t first = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  const size_t head = std::min<size_t>((16 - reinterpret_cast<uintptr_t>(at) % 16) % 16, bytes);
  const size_t vecs = (bytes - head) / 16;
  const unsigned word = value * 0x01010101u;
  auto* body = reinterpret_cast<uint4*>(at + head);
  for (size_t i = first; i < vecs; i += stride) body[i] = make_uint4(word, word, word, word);
  for (size_t i = first; i < head; i += stride) at[i] = value;
  for (size_t i = head + vecs * 16 + first; i < bytes; i += stride) at[i] = value;
}

}  // namespace

cudaError_t fill_or_record(void* at, size_t bytes, unsigned char value, cudaStream_t stream) {
  if (active_launch_recording() == nullptr) return cudaMemsetAsync(at, value, bytes, stream);
  const size_t per_block = size_t(kFillThreads) * 16 * 8;
  const unsigned blocks = unsigned(std::clamp<size_t>((bytes + per_block - 1) / per_block, 1, 1024));
  return launch_or_record(&fill_bytes, dim3(blocks), dim3(kFillThreads), dim3(1, 1, 1), 0, stream,
                          static_cast<unsigned char*>(at), bytes, value);
}

}  // namespace jax_cluster
