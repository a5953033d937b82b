// The gated epilogue of the sm90 grouped GEMM: D = act(gate) * up, written
// from the accumulators without a pass through shared memory or a second
// kernel. B's 2H columns hold gate and up in alternating blocks of
// kGateBlock (gate first), so each thread's accumulators hold a gate value
// and its up value one column block apart, and D has H columns.
//
// Why kGateBlock = 8: in the wgmma accumulator fragment ((2,2,V), MMA_M,
// MMA_N) of a 64xN atom, the first mode is a pair of adjacent columns, the
// second the row 8 below, the third steps 8 columns. A gate block of 8 puts
// a thread's up value at the next step of the third mode: no shuffles, and
// every N a multiple of 16 works for any tile width.
#pragma once

#include <cuda_runtime_api.h>

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/cuda_host_adapter.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/detail.hpp>
#include <cutlass/epilogue/dispatch_policy.hpp>
#include <cutlass/epilogue/thread/linear_combination.h>
#include <cutlass/layout/matrix.h>

#include "common/gemm_problem.h"
#include "kernels/epilogue_activation.cuh"

namespace jax_cluster::sm90 {

static_assert(kGateBlock == 8, "the gated epilogue pairs one column step of the wgmma fragment");

// The gate's activations on the special-function unit (MUFU's exponential
// and reciprocal): a few float32 ulp, far below the bf16 or fp16 result's
// rounding, and a handful of instructions where expf and an IEEE division
// take dozens; the epilogue runs them on half the tile between two
// mainloops. gelu's 0.5 * (1 + tanh(u)) is sigmoid(2u). The exponent is
// capped so 1 + e stays finite: the fast division's divisor must.
namespace gate_math {
CUTLASS_DEVICE float sigmoid(float x) { return __fdividef(1.0f, 1.0f + __expf(fminf(-x, 80.0f))); }
CUTLASS_DEVICE float silu(float x) { return x * sigmoid(x); }
CUTLASS_DEVICE float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return x * sigmoid(2.0f * kSqrt2OverPi * (x + 0.044715f * x * x * x));
}
}  // namespace gate_math

// A pointer-array epilogue without shared memory, in the form CUTLASS's
// Sm90TmaWarpSpecializedAdapter runs inside the cooperative array kernel:
// each consumer thread writes its own accumulators' gated pairs.
template <class ElementD_>
class GatedEpilogueArray {
 public:
  using EpilogueSchedule = cutlass::epilogue::PtrArrayNoSmemWarpSpecialized;
  using DispatchPolicy = EpilogueSchedule;
  using ElementAccumulator = float;
  using ElementCompute = float;
  using ElementScalar = float;
  using ElementD = ElementD_;
  using ElementOutput = ElementD_;
  using ElementC = void;  // no source operand
  using StrideD = cutlass::detail::TagToStrideC_t<cutlass::layout::RowMajor*>;
  using StrideC = StrideD;
  using InternalStrideC = cute::remove_pointer_t<StrideC>;
  using InternalStrideD = cute::remove_pointer_t<StrideD>;
  // Names the output types for GemmUniversalAdapter; never called.
  using ThreadEpilogueOp = cutlass::epilogue::thread::LinearCombination<ElementD, 1, float, float>;
  using GmemTiledCopyC = void;
  using GmemTiledCopyD = void;

  struct SharedStorage {};
  using TensorMapStorage = SharedStorage;

  struct Arguments {
    Activation activation = Activation::kSilu;
    ElementD** ptr_D = nullptr;
    StrideD dD{};
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args,
                                                  void*) {
    return args;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&, int) {
    return 0;
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*,
                                              cudaStream_t, cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const&) {
    return true;
  }

  CUTLASS_HOST_DEVICE explicit GatedEpilogueArray(Params const& params) : params_(params) {}

  CUTLASS_DEVICE bool is_source_needed() { return false; }

  // The activation is uniform over the launch: one branch per tile, outside
  // the unrolled stores.
  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine,
            class FrgLayout, class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_mnk,
                                 BlockCoordMNKL blk_coord_mnkl,
                                 cute::Tensor<FrgEngine, FrgLayout> const& accumulators,
                                 TiledMma tiled_mma, ResidueMNK, int thread_idx, char*) {
    auto go = [&](auto act) {
      store(act, problem_shape_mnkl, blk_shape_mnk, blk_coord_mnkl, accumulators, tiled_mma,
            thread_idx);
    };
    switch (params_.activation) {
      case Activation::kRelu: return go([](float x) { return activation::relu(x); });
      case Activation::kGelu: return go([](float x) { return gate_math::gelu_tanh(x); });
      case Activation::kGeluExact: return go([](float x) { return activation::gelu_erf(x); });
      case Activation::kSilu: return go([](float x) { return gate_math::silu(x); });
      default: return go([](float x) { return x; });
    }
  }

 private:
  template <class Act, class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL,
            class FrgEngine, class FrgLayout, class TiledMma>
  CUTLASS_DEVICE void store(Act act, ProblemShapeMNKL problem_shape_mnkl,
                            BlockShapeMNK blk_shape_mnk, BlockCoordMNKL blk_coord_mnkl,
                            cute::Tensor<FrgEngine, FrgLayout> const& acc, TiledMma tiled_mma,
                            int thread_idx) {
    using namespace cute;
    static_assert(rank<0>(FrgLayout{}) == 3 && size<0, 0>(FrgLayout{}) == 2 &&
                      size<0, 1>(FrgLayout{}) == 2 && size<0, 2>(FrgLayout{}) % 2 == 0,
                  "the gated epilogue reads the sm90 wgmma accumulator fragment");
    const int rows = get<0>(problem_shape_mnkl), cols = get<1>(problem_shape_mnkl);
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord_mnkl;
    ElementD* out = params_.ptr_D[l_coord];
    const int64_t ld = get<0>(params_.dD[l_coord]);
    // each accumulator's (row, GEMM column) in the group's problem
    Tensor tile = local_tile(make_identity_tensor(make_shape(rows, cols)),
                             take<0, 2>(blk_shape_mnk), make_coord(m_coord, n_coord));
    Tensor coords = tiled_mma.get_thread_slice(thread_idx).partition_C(tile);
    using Pair = cutlass::Array<ElementD, 2>;
    CUTLASS_PRAGMA_UNROLL
    for (int mm = 0; mm < size<1>(FrgLayout{}); ++mm) {
      CUTLASS_PRAGMA_UNROLL
      for (int nn = 0; nn < size<2>(FrgLayout{}); ++nn) {
        CUTLASS_PRAGMA_UNROLL
        for (int step = 0; step < size<0, 2>(FrgLayout{}); step += 2) {
          CUTLASS_PRAGMA_UNROLL
          for (int half = 0; half < 2; ++half) {
            auto gate = make_coord(make_coord(0, half, step), mm, nn);
            auto up = make_coord(make_coord(0, half, step + 1), mm, nn);
            auto gate_next = make_coord(make_coord(1, half, step), mm, nn);
            auto up_next = make_coord(make_coord(1, half, step + 1), mm, nn);
            const int row = get<0>(coords(gate)), col = get<1>(coords(gate));
            // cols is a multiple of 2 * kGateBlock, so the up block and the
            // adjacent column are inside whenever the gate column is
            if (row >= rows || col >= cols) continue;
            const int out_col = col / (2 * kGateBlock) * kGateBlock + col % kGateBlock;
            Pair h;
            h[0] = ElementD(act(acc(gate)) * acc(up));
            h[1] = ElementD(act(acc(gate_next)) * acc(up_next));
            *reinterpret_cast<Pair*>(out + row * ld + out_col) = h;
          }
        }
      }
    }
  }

  Params params_;
};

// The epilogue policy of kernels/cutlass_grouped_gemm.cuh for the gated rows.
struct GatedGroupedEpilogue {
  static constexpr int kColumnsPerOutput = 2;
  template <class Arch, class OpClass, class TileShape, class ClusterShape, class ElementD,
            int AlignD>
  using Collective = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<
      GatedEpilogueArray<ElementD>>;
  template <class Arguments, class Arrays>
  static Arguments arguments(const GemmProblem& p, const Arrays& arrays) {
    return {p.epilogue.activation, arrays.d, arrays.stride_d};
  }
};

}  // namespace jax_cluster::sm90
