// The activation of the fused epilogue, picked at run time from
// EpilogueArgs::activation, so one compiled variant serves all of them.
// CUTLASS's Sm90Compute node passes a functor's `Arguments` to each call;
// the choice is uniform over the launch, so the branch never diverges.
#pragma once

#include <cutlass/array.h>
#include <cutlass/cutlass.h>

#include "common/gemm_problem.h"

namespace jax_cluster {

namespace activation {

CUTLASS_HOST_DEVICE float relu(float x) { return x > 0.0f ? x : 0.0f; }

CUTLASS_HOST_DEVICE float gelu_tanh(float x) {  // jax.nn.gelu's default form
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

CUTLASS_HOST_DEVICE float gelu_erf(float x) {
  constexpr float kInvSqrt2 = 0.7071067811865476f;
  return 0.5f * x * (1.0f + erff(x * kInvSqrt2));
}

CUTLASS_HOST_DEVICE float silu(float x) { return x / (1.0f + expf(-x)); }

template <int N, class Fn>
CUTLASS_HOST_DEVICE cutlass::Array<float, N> map(cutlass::Array<float, N> const& x, Fn fn) {
  cutlass::Array<float, N> y;
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < N; ++i) y[i] = fn(x[i]);
  return y;
}

}  // namespace activation

template <class T>
struct RuntimeActivation;

template <>
struct RuntimeActivation<float> {
  struct Arguments {
    Activation activation = Activation::kNone;
  };

  CUTLASS_HOST_DEVICE float operator()(float x, Arguments const& args) const {
    switch (args.activation) {
      case Activation::kRelu: return activation::relu(x);
      case Activation::kGelu: return activation::gelu_tanh(x);
      case Activation::kGeluExact: return activation::gelu_erf(x);
      case Activation::kSilu: return activation::silu(x);
      default: return x;
    }
  }
};

// A fragment is a whole epilogue subtile of one thread (16 values on sm90),
// so the branch is taken once per subtile, outside the unrolled loop. A
// switch per value made every value jump into code far from the last
// (the unrolled subtiles hold every activation's copy), and that kernel ran
// at 0.46x the plain one even with no activation (docs/performance.md).
template <int N>
struct RuntimeActivation<cutlass::Array<float, N>> {
  using Arguments = RuntimeActivation<float>::Arguments;

  CUTLASS_HOST_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& x,
                                                          Arguments const& args) const {
    if (args.activation == Activation::kNone) return x;
    switch (args.activation) {
      case Activation::kRelu: return activation::map<N>(x, activation::relu);
      case Activation::kGelu: return activation::map<N>(x, activation::gelu_tanh);
      case Activation::kGeluExact: return activation::map<N>(x, activation::gelu_erf);
      case Activation::kSilu: return activation::map<N>(x, activation::silu);
      default: return x;
    }
  }
};

}  // namespace jax_cluster
