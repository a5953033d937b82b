// The activation of the fused epilogue, picked at run time from
// EpilogueArgs::activation, so one compiled variant serves all of them.
// CUTLASS's Sm90Compute node passes a functor's `Arguments` to each call;
// the choice is uniform over the launch, so the branch never diverges.
#pragma once

#include <cutlass/array.h>
#include <cutlass/cutlass.h>

#include "common/gemm_problem.h"

namespace jax_cluster {

template <class T>
struct RuntimeActivation;

template <>
struct RuntimeActivation<float> {
  struct Arguments {
    Activation activation = Activation::kNone;
  };

  CUTLASS_HOST_DEVICE float operator()(float x, Arguments const& args) const {
    constexpr float kSqrt2OverPi = 0.7978845608028654f;
    constexpr float kInvSqrt2 = 0.7071067811865476f;
    switch (args.activation) {
      case Activation::kRelu:
        return x > 0.0f ? x : 0.0f;
      case Activation::kGelu:  // tanh form, jax.nn.gelu's default
        return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
      case Activation::kGeluExact:
        return 0.5f * x * (1.0f + erff(x * kInvSqrt2));
      case Activation::kSilu:
        return x / (1.0f + expf(-x));
      default:
        return x;
    }
  }
};

template <int N>
struct RuntimeActivation<cutlass::Array<float, N>> {
  using Arguments = RuntimeActivation<float>::Arguments;

  CUTLASS_HOST_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& x,
                                                          Arguments const& args) const {
    RuntimeActivation<float> scalar;
    cutlass::Array<float, N> y;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) y[i] = scalar(x[i], args);
    return y;
  }
};

}  // namespace jax_cluster
