// The nanobind module: FFI capsules, the compiled-variant list, workspace
// sizes and device/occupancy queries. Built without CUDA it still imports and
// reports that it holds no kernels.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "common/cluster_tile_order.h"
#include "common/contract.h"
#include "common/plan.h"

#if JAX_CLUSTER_WITH_CUDA
#include <cuda_runtime_api.h>

#include "dispatch/device_slots.h"
#include "dispatch/gemm_dispatch.h"
#include "ffi/gemm_epilogue_ffi.h"
#include "ffi/gemm_ffi.h"
#include "ffi/kernel_image.h"
#include "ffi/plan_state.h"
#include "ffi/ragged_ffi.h"
#include "ffi/record_stage.h"
#include "ffi/scaled_gemm_ffi.h"
#include "ffi/token_tile_ffi.h"
#include "ffi/weight_block_ffi.h"
#include "kernels/kept_params.h"
#endif

namespace nb = nanobind;

namespace jax_cluster {
namespace {

nb::list plan_fields() {
  nb::list out;
  for (const char* name : kPlanFieldNames) out.append(name);
  return out;
}

// The work queue's walk, as the device decodes it: (m, n, l) per queue index.
nb::list cluster_tile_order(uint32_t tiles_m, uint32_t tiles_n, uint32_t batches, uint32_t swizzle,
                            bool along_n) {
  ClusterTileOrder order = ClusterTileOrder::make(tiles_m, tiles_n, batches, swizzle, along_n);
  nb::list out;
  for (uint64_t i = 0; i < order.size(); ++i) {
    ClusterTile t = order.at(i);
    out.append(nb::make_tuple(t.m, t.n, t.l));
  }
  return out;
}

#if JAX_CLUSTER_WITH_CUDA

nb::capsule capsule(const void* p) { return nb::capsule(const_cast<void*>(p)); }

// One target's stage handlers, as jax.ffi.register_ffi_target takes them.
nb::dict stages(const HandlerBundle& h, bool command_buffers) {
  nb::dict out;
  if (h.instantiate != nullptr)
    out["instantiate"] = capsule(reinterpret_cast<const void*>(h.instantiate));
  out["execute"] = capsule(
      reinterpret_cast<const void*>(command_buffers ? h.execute : h.execute_outside_graphs));
  return out;
}

struct Target {
  const char* name;
  HandlerBundle handlers;
};

std::vector<Target> targets() {
  return {{kGemmTarget, gemm_ffi_handlers()},
          {kGemmEpilogueTarget, gemm_epilogue_ffi_handlers()},
          {kRaggedDotTarget, ragged_ffi_handlers()},
          {kScaledGemmTarget, scaled_gemm_ffi_handlers()},
          {kScaledRaggedDotTarget, scaled_ragged_ffi_handlers()},
          {kGatedRaggedDotTarget, gated_ragged_ffi_handlers()},
          {kQuantizeTokenTilesTarget, token_tile_ffi_handlers()},
          {kQuantizeWeightBlocksTarget, weight_block_ffi_handlers()}};
}

nb::dict registrations(bool command_buffers) {
  nb::dict out;
  for (const Target& t : targets()) out[t.name] = stages(t.handlers, command_buffers);
  return out;
}

// Registers the targets that have a record stage through the XLA FFI API the
// probe captured (jax.ffi.register_ffi_target cannot pass that stage); the
// names registered, which the caller must not register again.
nb::list register_with_record(const std::string& platform) {
  nb::list out;
  for (const Target& t : targets()) {
    if (t.handlers.record == nullptr) continue;
    XLA_FFI_Handler_Bundle bundle{t.handlers.instantiate, nullptr, nullptr, t.handlers.execute,
                                  t.handlers.record};
    std::string err = register_bundle(t.name, platform.c_str(), bundle,
                                      XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE);
    if (!err.empty()) throw std::runtime_error(std::string(t.name) + ": " + err);
    out.append(t.name);
  }
  return out;
}

// The uncompressed cubins this extension embeds: SM and kernel names.
nb::list embedded_kernel_images() {
  std::string why;
  std::vector<CubinSummary> cubins = embedded_cubins(&why);
  if (!why.empty()) throw std::runtime_error(why);
  nb::list out;
  for (const CubinSummary& c : cubins) {
    nb::list kernels;
    for (const std::string& k : c.kernels) kernels.append(k);
    nb::dict row;
    row["sm"] = c.sm;
    row["kernels"] = kernels;
    out.append(row);
  }
  return out;
}

// The per-call-site state's type, as jax.ffi.register_ffi_type takes it.
nb::dict state_type() {
  nb::dict out;
  out["type_id"] = capsule(plan_state_type_id());
  out["type_info"] = capsule(plan_state_type_info());
  return out;
}

nb::list variants() {
  nb::list out;
  for (size_t i = 0; i < kNumVariants; ++i) {
    const VariantEntry& v = kVariants[i];
    nb::dict row;
    row["name"] = v.name;
    row["arch"] = v.arch;
    row["dtype"] = v.dtype;
    row["out"] = v.out;
    row["a_major"] = std::string(1, v.a_major);
    row["b_major"] = std::string(1, v.b_major);
    row["tile"] = nb::make_tuple(v.tile_m, v.tile_n, v.tile_k);
    row["cluster"] = nb::make_tuple(v.cluster_m, v.cluster_n);
    row["stages"] = v.stages;
    row["mma"] = v.mma;
    row["kind"] = v.kind;
    row["problem"] = v.problem;
    row["epilogue"] = v.epilogue;
    out.append(row);
  }
  return out;
}

// The Plan's string fields point into `plan_dict`, which outlives the call.
Plan plan_from_dict(const nb::dict& d) {
  Plan p;
#define JAX_CLUSTER_READ(type, name)                                           \
  if (!d.contains(#name)) throw nb::key_error("plan lacks field '" #name "'"); \
  p.name = nb::cast<type>(d[#name]);
  JAX_CLUSTER_PLAN_FIELDS(JAX_CLUSTER_READ)
#undef JAX_CLUSTER_READ
  return p;
}

size_t plan_workspace_size(const nb::dict& plan_dict, int m, int n, int k, int batch) {
  Plan plan = plan_from_dict(plan_dict);
  Dispatch dispatch;
  std::string err = resolve_plan(plan, &dispatch);
  if (!err.empty()) throw nb::value_error(err.c_str());
  GemmProblem problem{m, n, k, batch, nullptr, nullptr, nullptr};
  return dispatch.variant->ops().workspace_size(problem, dispatch.choices, dispatch.slots);
}

int variant_max_active_clusters(const std::string& name, int device_id) {
  const VariantEntry* v = find_variant(name);
  if (v == nullptr) throw nb::value_error(("no compiled variant " + name).c_str());
  return cached_max_active_clusters(*v, device_id);
}

nb::object query_device(int device_id) {
  DeviceFacts f;
  if (!device_facts(device_id, &f)) return nb::none();
  nb::dict out;
  out["name"] = std::string(f.name);
  out["sm_count"] = f.sm_count;
  out["compute_capability"] = nb::make_tuple(f.cc_major, f.cc_minor);
  out["smem_per_block_optin"] = f.smem_per_block_optin;
  out["l2_bytes"] = f.l2_bytes;
  return out;
}

#endif  // JAX_CLUSTER_WITH_CUDA

}  // namespace
}  // namespace jax_cluster

NB_MODULE(_ext, m) {
  using namespace jax_cluster;
  m.attr("with_cuda") = bool(JAX_CLUSTER_WITH_CUDA);
  m.attr("built_archs") = std::string(JAX_CLUSTER_ARCHS);
  m.attr("cuda_compiler") = std::string(JAX_CLUSTER_CUDA_COMPILER);
  m.def("plan_fields", &plan_fields, "Names of the Plan fields the FFI handler decodes.");
  m.def("cluster_tile_order", &cluster_tile_order, nb::arg("tiles_m"), nb::arg("tiles_n"),
        nb::arg("batches"), nb::arg("swizzle"), nb::arg("along_n"),
        "The dynamic scheduler's cluster tiles (m, n, l) in queue order.");
#if JAX_CLUSTER_WITH_CUDA
  m.def("registrations", &registrations, nb::arg("command_buffers") = true,
        "FFI stage handlers by target name; command_buffers=False gives execute handlers "
        "XLA never traces into its command buffers.");
  m.def("state_type", &state_type, "The type id and info of the handlers' per-call-site state.");
  m.def(
      "ffi_api_probe", [] { return capsule(reinterpret_cast<const void*>(ffi_api_probe())); },
      "A no-op FFI handler that keeps the XLA FFI API XLA calls it with.");
  m.def(
      "ffi_api_captured", [] { return captured_ffi_api() != nullptr; },
      "Whether XLA has called the probe handler (at its registration).");
  m.def("register_with_record", &register_with_record, nb::arg("platform"),
        "Registers the targets that have a record stage through the probed XLA FFI API; "
        "returns their names.");
  m.def(
      "record_counts",
      [] {
        RecordCounts c = record_counts();
        nb::dict out;
        out["created"] = c.created;
        out["updated"] = c.updated;
        out["captured"] = c.captured;
        out["reused"] = c.reused;
        return out;
      },
      "Commands the record stage created and updated, calls it left to XLA's capture, and calls "
      "whose launches it kept from an earlier call with the same buffers.");
  m.def(
      "kept_params_counts",
      [] {
        KeptParamsCounts c = kept_params_counts();
        nb::dict out;
        out["kept"] = c.kept;
        out["repointed"] = c.repointed;
        return out;
      },
      "Dense launches whose Params were described and kept, and launches made from kept Params "
      "moved to the call's buffers.");
  m.def("embedded_kernel_images", &embedded_kernel_images,
        "The cubins this extension embeds, each with its SM and kernel names.");
  m.def("variants", &variants, "The compiled variants (rows of the menu).");
  m.def("workspace_size", &plan_workspace_size, nb::arg("plan"), nb::arg("m"), nb::arg("n"),
        nb::arg("k"), nb::arg("batch"), "Scratch bytes one call with this plan needs.");
  m.def("max_active_clusters", &variant_max_active_clusters, nb::arg("variant"),
        nb::arg("device_id"),
        "cudaOccupancyMaxActiveClusters for a compiled variant on a device (0: none fit).");
  m.def("query_device", &query_device, nb::arg("device_id"),
        "SM count, compute capability, shared memory and L2 of a device, or None.");
#endif
}
