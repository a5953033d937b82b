// One pass that puts a grouped operand into the fp8 weight gradient's token
// tiles: x [M, C] (rows sorted by group) -> values [C, rows] in fp8, the
// rows in the block-aligned layout (each group starting on a kScaleBlock
// tile, primitives/token_tiles.py), and scales [rows/128, C] in float32, one
// per 128 rows of a column: amax times the float32 reciprocal of the
// format's largest value, 1 for an all-zero tile. Rows between groups are
// zeros. The values are x times 1 / scale, clipped to the format, rounded to nearest
// even: the same numbers as primitives/token_tile_quantize.py's XLA form.
//
// Host-callable from the FFI handler; the kernel is in token_tile_quantize.cu.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/fp8_quantize.h"

namespace jax_cluster {

struct TokenTileQuantize {
  const void* x = nullptr;  // [m, columns]
  int64_t m = 0, columns = 0;
  const int32_t* group_sizes = nullptr;  // [groups], on the device; ragged_dot's rule
  int groups = 0;
  int64_t rows = 0;         // of the block-aligned layout: a multiple of kScaleBlock
  void* values = nullptr;   // [columns, rows]
  float* scales = nullptr;  // [rows / kScaleBlock, columns]
  Fp8Input input = Fp8Input::kBf16;
  Fp8Output output = Fp8Output::kE4m3;
};

// Columns one block of the kernel covers; the handler asks for a multiple of it.
inline constexpr int kTokenTileColumns = 64;

// Launches on `stream`; nullptr on success, else a static message.
const char* quantize_token_tiles(const TokenTileQuantize& q, cudaStream_t stream);

}  // namespace jax_cluster
