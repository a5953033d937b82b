// The element types the fp8 quantization kernels (token tiles, weight
// blocks) read and write, as their host-side requests name them.
#pragma once

namespace jax_cluster {

enum class Fp8Input : int { kBf16 = 0, kF16 = 1, kF32 = 2 };
enum class Fp8Output : int { kE4m3 = 0, kE5m2 = 1 };

}  // namespace jax_cluster
