// The launch workspace of a grouped GEMM and the device-side preparation
// that fills it, shared by the sm90 and sm100 grouped kernels.
//
// Layout (each part 128-byte aligned): the per-group arrays of
// ragged_groups.cuh, the per-group scale pointers and, for MX, scale-factor
// layouts (block-scaled variants only), tile_start (only for schedulers
// that map linear tile ids to groups), then CUTLASS's own workspace.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include <cutlass/util/packed_stride.hpp>

#include "common/gemm_problem.h"
#include "kernels/launch_recording.h"
#include "kernels/ragged_groups.cuh"

namespace jax_cluster {

template <class Arrays, RaggedProblem Problem>
struct RaggedWorkspace {
  using Shape = typename Arrays::ShapeType;
  using StrideA = typename Arrays::StrideAType;
  using StrideB = typename Arrays::StrideBType;
  using StrideD = typename Arrays::StrideDType;
  using ElementA = typename Arrays::ElementAType;
  using ElementB = typename Arrays::ElementBType;
  using ElementD = typename Arrays::ElementDType;
  using ElementScale = typename Arrays::ElementScale;
  using LayoutSFA = typename Arrays::LayoutSFA;
  using LayoutSFB = typename Arrays::LayoutSFB;

  // Byte offsets; tile_start has no bytes unless asked for.
  struct Layout {
    size_t shapes, a, b, d, stride_a, stride_b, stride_d, scale_a, scale_b, layout_sfa, layout_sfb,
        tile_start, cutlass, total;
  };

  static Layout layout(int groups, size_t cutlass_bytes, bool with_tile_start,
                       bool with_scales = false) {
    auto round = [](size_t x) { return (x + 127) / 128 * 128; };
    Layout l{};
    size_t at = 0;
    auto take = [&](size_t bytes) {
      size_t here = at;
      at += round(bytes);
      return here;
    };
    l.shapes = take(groups * sizeof(Shape));
    l.a = take(groups * sizeof(void*));
    l.b = take(groups * sizeof(void*));
    l.d = take(groups * sizeof(void*));
    l.stride_a = take(groups * sizeof(StrideA));
    l.stride_b = take(groups * sizeof(StrideB));
    l.stride_d = take(groups * sizeof(StrideD));
    l.scale_a = take(with_scales ? groups * sizeof(ElementScale*) : 0);
    l.scale_b = take(with_scales ? groups * sizeof(ElementScale*) : 0);
    l.layout_sfa = take(with_scales ? groups * bytes_of<LayoutSFA> : 0);
    l.layout_sfb = take(with_scales ? groups * bytes_of<LayoutSFB> : 0);
    l.tile_start = take(with_tile_start ? (groups + 1) * sizeof(int32_t) : 0);
    l.cutlass = take(cutlass_bytes);
    l.total = at;
    return l;
  }

  static Arrays arrays(void* workspace, const Layout& l, bool with_tile_start,
                       bool with_scales = false) {
    auto* w = static_cast<char*>(workspace);
    Arrays out{
        reinterpret_cast<Shape*>(w + l.shapes),      reinterpret_cast<const ElementA**>(w + l.a),
        reinterpret_cast<const ElementB**>(w + l.b), reinterpret_cast<ElementD**>(w + l.d),
        reinterpret_cast<StrideA*>(w + l.stride_a),  reinterpret_cast<StrideB*>(w + l.stride_b),
        reinterpret_cast<StrideD*>(w + l.stride_d)};
    if (with_tile_start) out.tile_start = reinterpret_cast<int32_t*>(w + l.tile_start);
    if (with_scales) {
      out.scale_a = reinterpret_cast<const ElementScale**>(w + l.scale_a);
      out.scale_b = reinterpret_cast<const ElementScale**>(w + l.scale_b);
      if constexpr (bytes_of<LayoutSFA> > 0) {
        out.layout_sfa = reinterpret_cast<LayoutSFA*>(w + l.layout_sfa);
        out.layout_sfb = reinterpret_cast<LayoutSFB*>(w + l.layout_sfb);
      }
    }
    return out;
  }

  // Builds the per-group arrays from the device-resident group sizes and
  // zeros the output no tile covers, in one launch of `blocks` blocks on
  // `stream`. Operands (kernels/cutlass_grouped_gemm.cuh) lays out the rows
  // and each group's scales; ragged_m's D has d_cols columns (the epilogue's
  // output width). nullptr on success.
  template <class Operands>
  static const char* prepare(const GemmProblem& p, int d_cols, const Arrays& arrays, int blocks,
                             cudaStream_t stream, int cluster_tile_m = 1, int tiles_n = 0) {
    // Row counts: ragged_m splits M (GEMM m); ragged_k splits the contraction (GEMM k).
    int64_t rows = Problem == RaggedProblem::kRaggedM ? p.m : p.k;
    auto stride_a = cutlass::make_cute_packed_stride(StrideA{}, cute::make_shape(p.m, p.k, 1));
    auto stride_b = cutlass::make_cute_packed_stride(StrideB{}, cute::make_shape(p.n, p.k, 1));
    auto stride_d = cutlass::make_cute_packed_stride(StrideD{}, cute::make_shape(p.m, d_cols, 1));
    // a variant reads one kind of scales: float32 blocks, or MX bytes
    const void* scale_a = p.mx_scale_a != nullptr ? p.mx_scale_a : p.scale_a;
    const void* scale_b = p.mx_scale_b != nullptr ? p.mx_scale_b : p.scale_b;
    cudaError_t err = launch_or_record(
        &prepare_ragged_groups<Problem, Operands, Arrays, StrideA, StrideB, StrideD>, dim3(blocks),
        dim3(kRaggedPrepThreads), dim3(1, 1, 1), 0, stream, p.group_sizes, p.batch, rows, p.m, p.n,
        p.k, d_cols, p.a, p.b, p.d, arrays, stride_a, stride_b, stride_d, cluster_tile_m, tiles_n,
        int64_t(d_cols) * sizeof(ElementD), scale_a, scale_b);
    if (err != cudaSuccess) cudaGetLastError();
    return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
  }
};

}  // namespace jax_cluster
