// The work queue's walk over cluster tiles: bands of `width` rows along the
// minor axis, walked along the major axis, every other band backwards.
//
// Why not CUTLASS's swizzle: CUTLASS rounds the minor axis up to a multiple
// of the swizzle and runs the padded tiles' mainloops, so wide swizzles are
// only usable where they divide the grid (8448^2 in 128x256 tiles ran with
// swizzle 1, streaming all of B through L2 every wave). Here the last band
// is just narrower, so every index names a real tile. Reversing every other
// band makes the first tiles of a band reuse the panels its predecessor read
// last. Plain C++ so that the host (tests, explain) and device share it.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define JAX_CLUSTER_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define JAX_CLUSTER_HOST_DEVICE inline
#endif

namespace jax_cluster {

struct ClusterTile {
  uint32_t m = 0, n = 0, l = 0;  // in cluster tiles
  bool valid = false;
};

struct ClusterTileOrder {
  uint32_t tiles_m = 0, tiles_n = 0, batches = 0;  // the cluster-tile grid, unpadded
  uint32_t width = 1;                              // band height along the minor axis
  bool along_n = true;  // walk along N: the minor axis is M (CUTLASS's AlongN)

  static ClusterTileOrder make(uint32_t tiles_m, uint32_t tiles_n, uint32_t batches,
                               uint32_t swizzle, bool along_n) {
    ClusterTileOrder o;
    o.tiles_m = tiles_m;
    o.tiles_n = tiles_n;
    o.batches = batches;
    o.along_n = along_n;
    uint32_t minor = along_n ? tiles_m : tiles_n;
    o.width = swizzle < 1 ? 1 : (swizzle > minor && minor > 0 ? minor : swizzle);
    return o;
  }

  JAX_CLUSTER_HOST_DEVICE uint64_t size() const { return uint64_t(tiles_m) * tiles_n * batches; }

  JAX_CLUSTER_HOST_DEVICE ClusterTile at(uint64_t linear) const {
    ClusterTile t;
    if (linear >= size()) return t;
    const uint32_t minor_count = along_n ? tiles_m : tiles_n;
    const uint32_t major_count = along_n ? tiles_n : tiles_m;
    const uint64_t per_batch = uint64_t(tiles_m) * tiles_n;
    t.l = uint32_t(linear / per_batch);
    const uint64_t r = linear - uint64_t(t.l) * per_batch;
    const uint64_t band_size = uint64_t(width) * major_count;
    const uint32_t band = uint32_t(r / band_size);
    const uint64_t within = r - uint64_t(band) * band_size;
    const uint32_t first = band * width;
    const uint32_t height = minor_count - first < width ? minor_count - first : width;
    uint32_t minor = first + uint32_t(within % height);
    uint32_t major = uint32_t(within / height);
    if (band & 1u) major = major_count - 1 - major;
    t.m = along_n ? minor : major;
    t.n = along_n ? major : minor;
    t.valid = true;
    return t;
  }
};

}  // namespace jax_cluster
