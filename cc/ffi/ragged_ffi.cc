// The grouped GEMM calls (see the contract in kernels/cutlass_grouped_gemm.cuh):
// kRaggedDotTarget, kScaledRaggedDotTarget for fp8 operands with float32
// block scales (or, on MX variants, e8m0 scales), and kGatedRaggedDotTarget
// for the gated epilogue's variants (D = act(gate) * up, half of B's columns). The Plan is resolved
// once per call site (instantiate stage); each call checks its buffers and launches the grouped
// variant. Group sizes stay on the device; everything wrong comes back as ffi::Error.
#include "ffi/ragged_ffi.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include <cuda_runtime_api.h>

#include "common/contract.h"
#include "ffi/buffer_checks.h"
#include "ffi/dense_call.h"
#include "ffi/launch.h"
#include "ffi/mx_scale_checks.h"
#include "ffi/plan_attr.h"
#include "ffi/plan_state.h"
#include "ffi/record_stage.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_cluster {
namespace {

ffi::Error invalid(const char* target, const std::string& msg) {
  return ffi::Error::InvalidArgument(std::string(target) + ": " + msg);
}

// Fills the GEMM view (see GemmProblem) from the buffers as the variant lays them out.
std::string problem_from_buffers(const VariantEntry& v, const ffi::AnyBuffer& a,
                                 const ffi::AnyBuffer& b, int64_t groups, const ffi::AnyBuffer& d,
                                 GemmProblem* p) {
  auto da = a.dimensions(), db = b.dimensions(), dd = d.dimensions();
  bool ragged_m = std::string(v.problem) == "ragged_m";
  int64_t m, n, k;
  if (ragged_m) {  // A [rows, K]; B [G, K, N] or [G, N, K]; D [rows, N]
    if (da.size() != 2 || db.size() != 3 || dd.size() != 2)
      return "ragged_m takes A [rows, K], B [G, K, N] or [G, N, K] and gives [rows, N]; got A " +
             shape_text(da) + ", B " + shape_text(db) + ", result " + shape_text(dd);
    m = da[0], k = da[1];
    n = v.b_major == 'n' ? db[2] : db[1];
    int64_t kb = v.b_major == 'n' ? db[1] : db[2];
    if (db[0] != groups)
      return "B holds " + std::to_string(db[0]) + " groups, group_sizes " + std::to_string(groups);
    if (kb != k)
      return "contracting dimensions differ: A has " + std::to_string(k) + ", B has " +
             std::to_string(kb);
    if (std::string(v.epilogue) == "gated") {  // B's N columns are gate and up blocks
      if (n % (2 * kGateBlock))
        return "the gated epilogue needs N a multiple of " + std::to_string(2 * kGateBlock) +
               " (gate and up blocks of " + std::to_string(kGateBlock) + "), got " +
               std::to_string(n);
      if (dd[0] != m || dd[1] != n / 2)
        return "result must be [rows, N/2] (act(gate) * up); got " + shape_text(dd);
    } else if (dd[0] != m || dd[1] != n) {
      return "result must be [rows, N]; got " + shape_text(dd);
    }
  } else if (v.a_major == 'k') {  // A [K', rows]; B [N', rows]; D [G, K', N'] (block-scaled)
    if (da.size() != 2 || db.size() != 2 || dd.size() != 3)
      return "ragged_k (K-major) takes A [K', rows], B [N', rows] and gives [G, K', N']; got A " +
             shape_text(da) + ", B " + shape_text(db) + ", result " + shape_text(dd);
    if (da[1] != db[1]) return "A and B have different row counts";
    m = da[0], n = db[0], k = da[1];
    if (dd[0] != groups || dd[1] != m || dd[2] != n)
      return "result must be [G, K', N']; got " + shape_text(dd);
  } else {  // A [rows, K'] read transposed; B [rows, N']; D [G, K', N']
    if (da.size() != 2 || db.size() != 2 || dd.size() != 3)
      return "ragged_k takes A [rows, K'], B [rows, N'] and gives [G, K', N']; got A " +
             shape_text(da) + ", B " + shape_text(db) + ", result " + shape_text(dd);
    if (da[0] != db[0]) return "A and B have different row counts";
    m = da[1], n = db[1], k = da[0];
    if (dd[0] != groups || dd[1] != m || dd[2] != n)
      return "result must be [G, K', N']; got " + shape_text(dd);
  }
  const int64_t kMax = INT32_MAX;
  if (m > kMax || n > kMax || k > kMax || groups > kMax) return "a dimension exceeds 2^31 - 1";
  // TMA reads every row, and every group starts, at a 16-byte-aligned address.
  int64_t lead_a = ragged_m || v.a_major == 'k' ? k : m, lead_b = v.b_major == 'k' ? k : n;
  if (std::string err = check_tma_alignment(lead_a, lead_b, dd[dd.size() - 1], a, b, d);
      !err.empty())
    return err;
  *p = GemmProblem{static_cast<int>(m),      static_cast<int>(n), static_cast<int>(k),
                   static_cast<int>(groups), a.untyped_data(),    b.untyped_data(),
                   d.untyped_data()};
  return "";
}

// "" when `scale` is float32 with dimensions `want`, else what is wrong with it
// (per call: no allocation unless something is wrong).
template <size_t Rank>
std::string check_scale(const char* label, const ffi::AnyBuffer& scale,
                        const std::array<int64_t, Rank>& want) {
  if (scale.element_type() != ffi::DataType::F32)
    return std::string(label) + " must be float32, got " + dtype_name(scale.element_type());
  auto got = scale.dimensions();
  if (got.size() != Rank || !std::equal(want.begin(), want.end(), got.begin()))
    return std::string(label) + " must be " + shape_text({want.data(), Rank}) + "; got " +
           shape_text(got);
  return "";
}

// A block-scaled call's scales. ragged_m: scale_a [rows, K/128] (A's 1x128
// tiles, K-major, so a group's rows are one slice) and scale_b [G, K/128,
// ceil(N/128)] (each group's 128x128 blocks of B). ragged_k: scale_a
// [rows/128, K'] and scale_b [rows/128, N'] (both operands in 128-row tiles,
// each group starting on a tile).
// MX (ragged_m): e8m0 scale_a [mx_grouped_scale_rows(rows, G) * row bytes],
// each group's scales starting on a 128-row tile (at the earlier groups'
// rows, each rounded up to 128), and scale_b [G, layout_size(N, K)]. MX
// (ragged_k): scale_a [layout_size(K', rows)] and scale_b [layout_size(N',
// rows)], one layout of each whole operand.
std::string scales_from_buffers(const VariantEntry& v, const ffi::AnyBuffer& scale_a,
                                const ffi::AnyBuffer& scale_b, GemmProblem* p) {
  bool ragged_m = std::string(v.problem) == "ragged_m";
  if (p->k % kScaleBlock)  // the MX kernel's K tile is kScaleBlock deep too
    return std::string(ragged_m ? "K" : "the row count") + " = " + std::to_string(p->k) +
           " is not a multiple of the scale block " + std::to_string(kScaleBlock);
  if (v.dtype == kMxDtype) {
    const int64_t row_bytes = mx_scale_row_bytes(p->k);
    std::string err = ragged_m ? check_mx_scale("scale_a", scale_a,
                                                {mx_grouped_scale_rows(p->m, p->batch) * row_bytes})
                               : check_mx_scale("scale_a", scale_a, {mx_layout_size(p->m, p->k)});
    if (err.empty())
      err = ragged_m ? check_mx_scale("scale_b", scale_b,
                                      {int64_t(p->batch), mx_layout_size(p->n, p->k)})
                     : check_mx_scale("scale_b", scale_b, {mx_layout_size(p->n, p->k)});
    if (!err.empty()) return err;
    p->mx_scale_a = scale_a.untyped_data();
    p->mx_scale_b = scale_b.untyped_data();
    return "";
  }
  int64_t k_blocks = p->k / kScaleBlock, n_blocks = (p->n + kScaleBlock - 1) / kScaleBlock;
  if (ragged_m) {
    if (std::string err = check_scale<2>("scale_a", scale_a, {p->m, k_blocks}); !err.empty())
      return err;
    if (std::string err = check_scale<3>("scale_b", scale_b, {p->batch, k_blocks, n_blocks});
        !err.empty())
      return err;
  } else {
    if (std::string err = check_scale<2>("scale_a", scale_a, {k_blocks, p->m}); !err.empty())
      return err;
    if (std::string err = check_scale<2>("scale_b", scale_b, {k_blocks, p->n}); !err.empty())
      return err;
  }
  p->scale_a = static_cast<const float*>(scale_a.untyped_data());
  p->scale_b = static_cast<const float*>(scale_b.untyped_data());
  return "";
}

// Refuses, once per call site, a variant the calling target cannot run.
PlanStateOr instantiate(Plan plan, bool scaled, bool gated = false) {
  std::unique_ptr<PlanState> state = PlanState::resolve(plan);
  if (!state->error().empty()) return std::move(state);
  const VariantEntry& v = state->variant();
  if (std::string(v.problem) == "dense")
    state->refuse(std::string("variant ") + v.name + " is dense: call " +
                  (scaled ? kScaledGemmTarget : kGemmTarget));
  else if ((std::string(v.epilogue) == "gated") != gated)
    state->refuse(std::string("variant ") + v.name +
                  (gated ? " has no gated epilogue: call " + std::string(kRaggedDotTarget)
                         : " has the gated epilogue: call " + std::string(kGatedRaggedDotTarget)));
  else if (block_scaled(v) != scaled)
    state->refuse(std::string("variant ") + v.name +
                  (scaled ? " is not block-scaled: call " + std::string(kRaggedDotTarget)
                          : " is block-scaled: call " + std::string(kScaledRaggedDotTarget)));
  return std::move(state);
}

PlanStateOr ragged_instantiate(Plan plan) { return instantiate(plan, false); }
PlanStateOr scaled_ragged_instantiate(Plan plan) { return instantiate(plan, true); }

// The gated target also decodes its activation once per call site.
PlanStateOr gated_ragged_instantiate(Plan plan, int32_t activation) {
  PlanStateOr state = instantiate(plan, false, true);
  (*state)->refuse(activation_from_attr(activation, &(*state)->epilogue.activation));
  return state;
}

// Both targets' GEMM view of a call's buffers (the scales are null for
// kRaggedDotTarget); an error names what is wrong.
ffi::Error ragged_problem(const char* target, const PlanState& state, const ffi::AnyBuffer& a,
                          const ffi::AnyBuffer& b, const ffi::AnyBuffer* scale_a,
                          const ffi::AnyBuffer* scale_b, const ffi::Buffer<ffi::S32>& group_sizes,
                          const ffi::AnyBuffer& d, GemmProblem* problem) {
  if (!state.error().empty()) return invalid(target, state.error());
  const VariantEntry& v = state.variant();
  if (std::string err = check_dtypes(v, a, b, d); !err.empty()) return invalid(target, err);
  if (group_sizes.dimensions().size() != 1) return invalid(target, "group_sizes must be rank 1");
  int64_t groups = group_sizes.dimensions()[0];
  if (groups < 1) return invalid(target, "group_sizes is empty");
  if (std::string err = problem_from_buffers(v, a, b, groups, d, problem); !err.empty())
    return invalid(target, err);
  if (scale_a != nullptr)
    if (std::string err = scales_from_buffers(v, *scale_a, *scale_b, problem); !err.empty())
      return invalid(target, err);
  problem->group_sizes = group_sizes.typed_data();
  problem->epilogue = state.epilogue;  // the gated target's activation
  return ffi::Error::Success();
}

ffi::Error execute(const char* target, PlanState* state, cudaStream_t stream,
                   const ffi::AnyBuffer& a, const ffi::AnyBuffer& b, const ffi::AnyBuffer* scale_a,
                   const ffi::AnyBuffer* scale_b, const ffi::Buffer<ffi::S32>& group_sizes,
                   ffi::AnyBuffer d, ffi::AnyBuffer workspace) {
  GemmProblem problem;
  if (ffi::Error err =
          ragged_problem(target, *state, a, b, scale_a, scale_b, group_sizes, d, &problem);
      err.failure())
    return err;
  if (d.size_bytes() == 0) return ffi::Error::Success();
  // Both problems contract over GEMM k: K for ragged_m, the rows for ragged_k.
  if (problem.k == 0) return zero_output(target, d, stream);  // empty sums everywhere
  return launch_variant(target, *state, problem, d, workspace, stream);
}

// Both targets' record stage: the call's launches as command-buffer nodes, or
// XLA's capture of the execute handler (which reports any error).
ffi::Error record(const char* target, RecordContext& ctx, PlanState* state, cudaStream_t stream,
                  const ffi::AnyBuffer& a, const ffi::AnyBuffer& b, const ffi::AnyBuffer* scale_a,
                  const ffi::AnyBuffer* scale_b, const ffi::Buffer<ffi::S32>& group_sizes,
                  ffi::AnyBuffer d, ffi::AnyBuffer workspace) {
  GemmProblem problem;
  if (d.size_bytes() == 0 ||
      ragged_problem(target, *state, a, b, scale_a, scale_b, group_sizes, d, &problem).failure())
    return ctx.RequestStreamCapture();
  return record_launch(target, ctx, *state, problem, d, workspace, stream);
}

ffi::Error ragged_execute(PlanState* state, cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b,
                          ffi::Buffer<ffi::S32> group_sizes, ffi::Result<ffi::AnyBuffer> d,
                          ffi::Result<ffi::AnyBuffer> workspace) {
  return execute(kRaggedDotTarget, state, stream, a, b, nullptr, nullptr, group_sizes, *d,
                 *workspace);
}

ffi::Error scaled_ragged_execute(PlanState* state, cudaStream_t stream, ffi::AnyBuffer a,
                                 ffi::AnyBuffer b, ffi::AnyBuffer scale_a, ffi::AnyBuffer scale_b,
                                 ffi::Buffer<ffi::S32> group_sizes, ffi::Result<ffi::AnyBuffer> d,
                                 ffi::Result<ffi::AnyBuffer> workspace) {
  return execute(kScaledRaggedDotTarget, state, stream, a, b, &scale_a, &scale_b, group_sizes, *d,
                 *workspace);
}

ffi::Error gated_ragged_execute(PlanState* state, cudaStream_t stream, ffi::AnyBuffer a,
                                ffi::AnyBuffer b, ffi::Buffer<ffi::S32> group_sizes,
                                ffi::Result<ffi::AnyBuffer> d,
                                ffi::Result<ffi::AnyBuffer> workspace) {
  return execute(kGatedRaggedDotTarget, state, stream, a, b, nullptr, nullptr, group_sizes, *d,
                 *workspace);
}

ffi::Error ragged_record(RecordContext ctx, PlanState* state, cudaStream_t stream, ffi::AnyBuffer a,
                         ffi::AnyBuffer b, ffi::Buffer<ffi::S32> group_sizes,
                         ffi::Result<ffi::AnyBuffer> d, ffi::Result<ffi::AnyBuffer> workspace) {
  return record(kRaggedDotTarget, ctx, state, stream, a, b, nullptr, nullptr, group_sizes, *d,
                *workspace);
}

ffi::Error gated_ragged_record(RecordContext ctx, PlanState* state, cudaStream_t stream,
                               ffi::AnyBuffer a, ffi::AnyBuffer b,
                               ffi::Buffer<ffi::S32> group_sizes, ffi::Result<ffi::AnyBuffer> d,
                               ffi::Result<ffi::AnyBuffer> workspace) {
  return record(kGatedRaggedDotTarget, ctx, state, stream, a, b, nullptr, nullptr, group_sizes, *d,
                *workspace);
}

ffi::Error scaled_ragged_record(RecordContext ctx, PlanState* state, cudaStream_t stream,
                                ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::AnyBuffer scale_a,
                                ffi::AnyBuffer scale_b, ffi::Buffer<ffi::S32> group_sizes,
                                ffi::Result<ffi::AnyBuffer> d,
                                ffi::Result<ffi::AnyBuffer> workspace) {
  return record(kScaledRaggedDotTarget, ctx, state, stream, a, b, &scale_a, &scale_b, group_sizes,
                *d, *workspace);
}

// Each target's buffers (A, B[, scale_a, scale_b], group sizes; D and the
// workspace), after either stage's contexts.
template <class Binding>
auto with_buffers(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::Buffer<ffi::S32>>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>();
}

// A, B, scale_a and scale_b are four AnyBuffers before the group sizes.
template <class Binding>
auto with_scaled_buffers(Binding binding) {
  return with_buffers(
      std::move(binding).template Arg<ffi::AnyBuffer>().template Arg<ffi::AnyBuffer>());
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RaggedInstantiate, ragged_instantiate,
                              ffi::Ffi::BindInstantiate().Attr<Plan>("plan"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(RaggedExecute, ragged_execute, with_buffers(bind_execute()),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(RaggedExecuteOutsideGraphs, ragged_execute,
                              with_buffers(bind_execute()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(RaggedRecord, ragged_record, with_buffers(bind_record()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(ScaledRaggedInstantiate, scaled_ragged_instantiate,
                              ffi::Ffi::BindInstantiate().Attr<Plan>("plan"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(ScaledRaggedExecute, scaled_ragged_execute,
                              with_scaled_buffers(bind_execute()),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(ScaledRaggedExecuteOutsideGraphs, scaled_ragged_execute,
                              with_scaled_buffers(bind_execute()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(ScaledRaggedRecord, scaled_ragged_record,
                              with_scaled_buffers(bind_record()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    GatedRaggedInstantiate, gated_ragged_instantiate,
    ffi::Ffi::BindInstantiate().Attr<Plan>("plan").Attr<int32_t>("activation"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(GatedRaggedExecute, gated_ragged_execute,
                              with_buffers(bind_execute()), {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(GatedRaggedExecuteOutsideGraphs, gated_ragged_execute,
                              with_buffers(bind_execute()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(GatedRaggedRecord, gated_ragged_record, with_buffers(bind_record()));

HandlerBundle ragged_ffi_handlers() {
  return {RaggedInstantiate, RaggedExecute, RaggedExecuteOutsideGraphs, RaggedRecord};
}

HandlerBundle scaled_ragged_ffi_handlers() {
  return {ScaledRaggedInstantiate, ScaledRaggedExecute, ScaledRaggedExecuteOutsideGraphs,
          ScaledRaggedRecord};
}

HandlerBundle gated_ragged_ffi_handlers() {
  return {GatedRaggedInstantiate, GatedRaggedExecute, GatedRaggedExecuteOutsideGraphs,
          GatedRaggedRecord};
}

}  // namespace jax_cluster
