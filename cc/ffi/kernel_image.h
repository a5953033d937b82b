// The machine code of one of our kernels, as XLA's record stage takes it: the
// kernel's mangled name and the cubin that holds it. nvcc embeds each
// translation unit's cubins, uncompressed, in this shared object's
// .nv_fatbin section; the lookup reads them from the file once.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace jax_cluster {

struct KernelImage {
  std::string name;  // the kernel's mangled name inside the cubin
  const void* cubin = nullptr;
  size_t cubin_bytes = 0;
};

// The image of `kernel` (a __global__ function's host-side address) in the
// cubins for SM `sm` (90, 100, ...), or nullptr with `why` set. Cached; safe
// from any thread.
const KernelImage* find_kernel_image(const void* kernel, int sm, std::string* why);

// Every cubin of this shared object: its SM number (90, 100, ...) and the
// kernels it defines. For tests and diagnostics.
struct CubinSummary {
  int sm = 0;
  std::vector<std::string> kernels;
};
std::vector<CubinSummary> embedded_cubins(std::string* why);

}  // namespace jax_cluster
