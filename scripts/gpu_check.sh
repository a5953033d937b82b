#!/usr/bin/env bash
# The GPU check: build with 16 jobs, then the steps in $STEPS (default:
# tests bench grid). Logs, JSON and plots are written to $LOGS and packed into
# $RESULTS/logs.tgz after every step and every 30 s, so a run cut off by a
# time limit still leaves what finished; $RESULTS also gets prebuilt/_ext*.so.
# Steps: smoke tests checks selftest sweep sanitize sharding lgemms bench grid planner sched walk
# pdl launchcost layers ragged conformance gated moe decode decodefp8 fp8decoderows dense groupedroute gclusters hostcost fp8 fp8grouped fp8wgrad fp8weights train fp8train traindp fallback pytest (pytest: the tests named by $PYTEST_ARGS;
# FP8_TESTS=0: the fp8 and fp8weights steps without their GPU tests, FP8_ARGS its arguments).
# Offline machines: put the nvidia-cutlass (and absl-py) wheels in .whl/ first; the
# ragged and moe steps also want tokamax's (tokamax==0.0.17 einshape qwix immutabledict
# pydantic pydantic-core annotated-types typing-inspection typing-extensions), whose
# profiler import tests/stubs stands in for.
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS=${RESULTS:-/tmp/jax_cluster_out}
LOGS=${LOGS:-/tmp/jax_cluster_logs}
mkdir -p "$RESULTS" "$LOGS"
pack() {
  local part="$RESULTS/logs.tgz.$BASHPID"
  tar czf "$part" -C "$LOGS" . 2>/dev/null && mv "$part" "$RESULTS/logs.tgz"
}
# every 30 s too: a step cut off by the call's time limit keeps its log so far
( while sleep 30; do pack; done ) &
PACKER=$!
trap 'kill $PACKER 2>/dev/null; wait $PACKER 2>/dev/null; pack' EXIT
# a time limit's SIGTERM must run the EXIT trap too, or the last step's results are lost
trap 'exit 143' TERM INT
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
step() { echo "== $(date +%T) $*"; }

if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi >"$LOGS/nvidia-smi.txt" 2>&1

# PREBUILT=DIR reuses an extension an earlier run built on this kind of
# machine (saved by that run in $RESULTS/prebuilt): the sources must not have
# changed in cc/ or jax_cluster/planning/*.json since. It saves the build's minutes.
if [ -n "${PREBUILT:-}" ]; then
  step "prebuilt extension from $PREBUILT"
  cp "$PREBUILT"/_ext*.so jax_cluster/ || exit 1
  # one built elsewhere (another CUDA, Python or jax) must load with its kernels and XLA must
  # take its handlers (a first kernel call registers them), or the build runs
  if (cd /tmp && JAX_CLUSTER_ROUTE=kernel PYTHONPATH=$OLDPWD${PYTHONPATH:+:$PYTHONPATH} "$PY" -c \
      'import sys, jax, jax.numpy as jnp, jax_cluster
a = jnp.ones((256, 256), jnp.bfloat16)
jax.block_until_ready(jax.jit(jax_cluster.matmul)(a, a))
sys.exit(not jax_cluster.info().with_kernels)'); then
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  else
    echo "the prebuilt extension has no kernels here: building"; rm -f jax_cluster/_ext*.so; PREBUILT=
  fi
fi
if [ -z "${PREBUILT:-}" ]; then
  step build
  # Only the arch of the GPU at hand by default (ARCHS="sm90a;sm100f" for both): CI
  # builds and SASS-checks sm100f, and skipping it here saves GPU minutes.
  # VARIANTS=REGEX builds only the matching menu rows, for a quick measurement.
  # One row per unit: 16 cores finish 29 units sooner than 8 bigger ones.
  if ! "$PY" -m pip install -v --no-build-isolation --no-deps -C cmake.define.JAX_CLUSTER_CUDA=ON \
      -C "cmake.define.JAX_CLUSTER_ARCHS=${ARCHS:-sm90a}" \
      -C "cmake.define.JAX_CLUSTER_VARIANTS=${VARIANTS:-}" \
      -C "cmake.define.JAX_CLUSTER_UNIT_SIZE=${UNIT_SIZE:-1}" \
      -C build-dir=/tmp/jax_cluster_build . >"$LOGS/build.log" 2>&1; then
    tail -50 "$LOGS/build.log"; pack; exit 1
  fi
  grep -E "warning C7510|spill" "$LOGS/build.log" | head -5
  mkdir -p "$RESULTS/prebuilt" && cp /tmp/jax_cluster_build/_ext*.so "$RESULTS/prebuilt/"
fi
(cd /tmp && "$PY" -c 'import jax_cluster; print(jax_cluster.info())') | tee "$LOGS/info.txt"
pack

PYTEST=$(dirname "$(command -v "$PY")")/pytest
for part in ${STEPS:-tests bench grid}; do
  case $part in
    tests) step "tests (all but the size grid)"
           "$PYTEST" -q -rs -p no:cacheprovider -k "not size_grid" tests 2>&1 | tee "$LOGS/tests.log" | tail -25 ;;
    checks) step "self-test and the GPU test files, side by side (both are compile-bound)"
           export XLA_PYTHON_CLIENT_PREALLOCATE=false
           (cd /tmp && XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0" \
              "$PY" -m jax_cluster.selftest ${SELFTEST_ARGS:-}) >"$LOGS/selftest.log" 2>&1 &
           # -v: a run cut off by its time limit still names each test's outcome in the log;
           # the reference dots need no autotuning, and the files spread over $XDIST workers
           XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0" "$PYTEST" -v -rfEs -p no:cacheprovider \
              ${XDIST:--n 4} --durations=20 -k "not size_grid and not sanitizer and not sweep" tests/gpu \
              tests/cpu/test_nn.py tests/cpu/test_linear.py tests/cpu/test_ragged_dot.py \
              tests/cpu/test_autotune.py >"$LOGS/gputests.log" 2>&1
           wait
           grep -E "FAILED|ERROR" "$LOGS/gputests.log" | head -20; tail -n 3 "$LOGS/gputests.log"; tail -n 5 "$LOGS/selftest.log"
           unset XLA_PYTHON_CLIENT_PREALLOCATE ;;
    sweep) step "the seeded sweep and the 2^31-element problems on the kernels"
           XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0" \
             "$PYTEST" -q -rfEs -p no:cacheprovider ${XDIST:--n 8} \
             tests/gpu/test_gpu_sweep.py 2>&1 | tee "$LOGS/sweep.log" | tail -15 ;;
    sanitize) step "compute-sanitizer memcheck and racecheck over every kernel variant and schedule"
           JAX_CLUSTER_SANITIZE_LOGS="$LOGS" "$PYTEST" -q -rs -s -p no:cacheprovider ${XDIST:--n 3} tests/gpu/test_gpu_sanitizer.py 2>&1 | tee "$LOGS/sanitizer.log" | tail -15 ;;
    smoke) step "smoke: the dense GEMM tests (the size grid aside), stopping at the first failure"
           "$PYTEST" -q -x -p no:cacheprovider -k "not size_grid" tests/gpu/test_gpu_gemm.py 2>&1 | tee "$LOGS/smoke.log" | tail -8 ;;
    hostcost) step "host cost per call: default, XLA's command buffers off, kernel calls as their own thunks, captured"
           { "$PY" benchmarks/bench_host_overhead.py --out "$LOGS"
             XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer=" "$PY" benchmarks/bench_host_overhead.py --out "$LOGS"
             JAX_CLUSTER_COMMAND_BUFFERS=0 "$PY" benchmarks/bench_host_overhead.py --out "$LOGS"
             JAX_CLUSTER_RECORD=0 "$PY" benchmarks/bench_host_overhead.py --out "$LOGS"; } 2>&1 | tee "$LOGS/hostcost.log" ;;
    pdl)   step "host cost per call without programmatic dependent launch, and with it on stream launches only"
           { JAX_CLUSTER_PDL=0 "$PY" benchmarks/bench_host_overhead.py --out "$LOGS"
             JAX_CLUSTER_PDL=0 XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer=" "$PY" benchmarks/bench_host_overhead.py --out "$LOGS"
             JAX_CLUSTER_PDL=0 JAX_CLUSTER_COMMAND_BUFFERS=0 "$PY" benchmarks/bench_host_overhead.py --out "$LOGS"
             JAX_CLUSTER_PDL=stream "$PY" benchmarks/bench_host_overhead.py --out "$LOGS"; } 2>&1 | tee "$LOGS/pdl.log" ;;
    launchcost) step "host cost of one launch by each launch path, a TMA descriptor and a counter memset"
           { nvcc -O2 -std=c++17 -arch=sm_90a -o /tmp/launch_cost benchmarks/investigations/launch_cost.cu \
               && /tmp/launch_cost > "$LOGS/launch_cost.jsonl"; } 2>&1 | tee "$LOGS/launch_cost.log"
           cat "$LOGS/launch_cost.jsonl" ;;
    dense) step "the dense suite of model GEMMs against XLA"
           "$PY" benchmarks/bench_dense_suite.py --out "$LOGS" ${DENSE_ARGS:-} 2>&1 | tee "$LOGS/dense.log" | tail -30 ;;
    groupedroute) step "small grouped products on the grouped kernel and on XLA's ragged_dot"
           "$PY" benchmarks/bench_ragged_routing.py --out "$LOGS" ${GROUPED_ROUTE_ARGS:-} 2>&1 | tee "$LOGS/groupedroute.log" | tail -12 ;;
    gclusters) step "grouped static 2-CTA cluster rows: self-test, then against the default and torch"
           { (cd /tmp && XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0" \
                "$PY" -m jax_cluster.selftest --only grouped_static)
             "$PY" benchmarks/investigations/grouped_clusters.py --out "$LOGS" ${GCLUSTER_ARGS:-}; } 2>&1 \
             | tee "$LOGS/grouped_clusters.log" | tail -40 ;;
    sharding) step "partitioning on every GPU of this machine (test_gpu_sharding needs two)"
           "$PYTEST" -q -rs -p no:cacheprovider tests/gpu/test_gpu_sharding.py 2>&1 | tee "$LOGS/sharding.log" | tail -15 ;;
    bench) step benchmark
           "$PY" benchmarks/bench_matmul.py --out "$LOGS" ${BENCH_ARGS:-} 2>&1 | tee "$LOGS/bench.log" ;;
    selftest) step "self-test (every compiled variant)"  # its reference dots need no autotuning
           (cd /tmp && XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0" \
              "$PY" -m jax_cluster.selftest ${SELFTEST_ARGS:-}) 2>&1 | tee "$LOGS/selftest.log" | tail -60 ;;
    fallback) step "jax_cluster's XLA fallback against jnp.dot"
           "$PY" benchmarks/bench_fallback.py --out "$LOGS" 2>&1 | tee "$LOGS/fallback.log" ;;
    # PYTEST_ARGS is split on spaces: a -k expression with spaces goes in PYTEST_ADDOPTS
    pytest) step "pytest $PYTEST_ARGS"
           "$PYTEST" -q -rs -p no:cacheprovider $PYTEST_ARGS 2>&1 | tee "$LOGS/pytest.log" | tail -15 ;;
    planner) step "planner vs exhaustive timing"
           "$PY" benchmarks/bench_planner.py --out "$LOGS" 2>&1 | tee "$LOGS/planner.log" | tail -25 ;;
    walk)  step "work-queue walk: raster x band width, pinned, interleaved rounds"
           "$PY" benchmarks/bench_walk.py --out "$LOGS" 2>&1 | tee "$LOGS/walk.log" ;;
    sched) step "schedules at boundary tile counts"
           "$PY" benchmarks/bench_schedules.py --out "$LOGS" 2>&1 | tee "$LOGS/sched.log" ;;
    layers) step "Flax layers against Flax's own (forward + backward)"
           "$PY" benchmarks/bench_layers.py --out "$LOGS" ${LAYERS_ARGS:-} 2>&1 | tee "$LOGS/layers.log" ;;
    lgemms) step "the three GEMMs of a Linear step, each against XLA"
           "$PY" benchmarks/bench_linear_gemms.py --out "$LOGS" ${LGEMMS_ARGS:-} 2>&1 | tee "$LOGS/lgemms.log" ;;
    ragged) step "ragged_dot benchmark"
           PYTHONPATH=$PWD/tests/stubs:${PYTHONPATH:-} "$PY" benchmarks/bench_ragged.py --out "$LOGS" ${RAGGED_ARGS:-} 2>&1 | tee "$LOGS/ragged.log" ;;
    decode) step "ragged_dot at decode sizes against its roofline, tokamax and XLA"
           PYTHONPATH=$PWD/tests/stubs:${PYTHONPATH:-} "$PY" benchmarks/bench_ragged_decode.py --out "$LOGS" ${DECODE_ARGS:-} 2>&1 | tee "$LOGS/decode.log" ;;
    decodefp8) step "ragged_dot at decode sizes on block-scaled fp8 operands: roofline, its bf16 path, tokamax and XLA"
           PYTHONPATH=$PWD/tests/stubs:${PYTHONPATH:-} "$PY" benchmarks/bench_ragged_decode.py --fp8 --out "$LOGS" ${DECODE_ARGS:-} 2>&1 | tee "$LOGS/decode_fp8.log" ;;
    fp8decoderows) step "block-scaled decode rows: self-test, GPU tests, sanitizer over them, then decode sizes on fp8 operands"
           { (cd /tmp && XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0" "$PY" -m jax_cluster.selftest --only ragged_decode_blockwise)
             "$PYTEST" -q -rs -p no:cacheprovider tests/gpu/test_gpu_decode_fp8.py
             JAX_CLUSTER_SANITIZE_VARIANTS=ragged_decode_blockwise JAX_CLUSTER_SANITIZE_LOGS="$LOGS" "$PYTEST" -q -rs \
               -p no:cacheprovider -k decode tests/gpu/test_gpu_sanitizer.py
             PYTHONPATH=$PWD/tests/stubs:${PYTHONPATH:-} "$PY" benchmarks/bench_ragged_decode.py --fp8 --out "$LOGS" \
               ${DECODE_ARGS:-}; } 2>&1 | tee "$LOGS/fp8_decode_rows.log" | tail -40 ;;
    conformance) step "tokamax's ragged_dot tests (from its wheel) through the grouped kernels: JAX_CLUSTER_ROUTE=kernel"
           { (cd /tmp && JAX_CLUSTER_ROUTE=kernel "$PY" -c 'import jax.numpy as jnp, jax_cluster
print("their 1024 x 128 -> 256 bf16 product runs", jax_cluster.plan_ragged(1024, 256, 128, 8,
      problem="ragged_m", dtype=jnp.bfloat16).variant or "on XLA")')
             JAX_CLUSTER_ROUTE=kernel PYTHONPATH=$PWD/tests/stubs:${PYTHONPATH:-} "$PYTEST" -v -rfEs -p no:cacheprovider \
               tests/cpu/test_tokamax_conformance.py; } 2>&1 | tee "$LOGS/conformance.log" | grep -v -E "PASSED|SKIPPED" | tail -8 ;;
    gated) step "gated epilogue: self-test, GPU tests, sanitizer over the gated row, then against the unfused forward"
           { (cd /tmp && XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0" "$PY" -m jax_cluster.selftest --only _gated)
             "$PYTEST" -q -rs -p no:cacheprovider -k gated tests/gpu/test_gpu_ragged.py
             JAX_CLUSTER_SANITIZE_VARIANTS=_gated JAX_CLUSTER_SANITIZE_LOGS="$LOGS" "$PYTEST" -q -rs -p no:cacheprovider \
               -k grouped tests/gpu/test_gpu_sanitizer.py
             "$PY" benchmarks/bench_gated.py --out "$LOGS" ${GATED_ARGS:-}; } 2>&1 | tee "$LOGS/gated.log" | tail -40 ;;
    moe)   step "MoE MLP forward + backward: jax_cluster, tokamax, XLA (and its experimental paths), torch"
           PYTHONPATH=$PWD/tests/stubs:${PYTHONPATH:-} "$PY" benchmarks/bench_moe_mlp.py --out "$LOGS" ${MOE_ARGS:---experimental-xla} 2>&1 | tee "$LOGS/moe.log" ;;
    fp8)   step "block-scaled fp8: its GPU tests, then against torch._scaled_mm and jax_cluster's bf16"
           { [ "${FP8_TESTS:-1}" = 0 ] || "$PYTEST" -q -rs -p no:cacheprovider tests/gpu/test_gpu_fp8.py tests/cpu/test_scaled_gemm.py
             "$PY" benchmarks/bench_fp8_dense.py --out "$LOGS" ${FP8_ARGS:-}; } 2>&1 | tee "$LOGS/fp8.log" | tail -30 ;;
    fp8grouped) step "block-scaled fp8 grouped: against torch._scaled_grouped_mm and jax_cluster's bf16 ragged_dot"
           "$PY" benchmarks/bench_fp8_grouped.py --out "$LOGS" 2>&1 | tee "$LOGS/fp8_grouped.log" | tail -20 ;;
    fp8wgrad) step "block-scaled fp8 weight gradient (ragged_k): against torch and jax_cluster's bf16"
           "$PY" benchmarks/bench_fp8_wgrad.py --out "$LOGS" ${WGRAD_ARGS:-} 2>&1 | tee "$LOGS/fp8_wgrad.log" | tail -20 ;;
    fp8weights) step "fp8 weight quantization kernel: its and the fp8 GPU tests, sanitizer, against XLA's form, then the fp8 MoE layer both ways"
           { [ "${FP8_TESTS:-1}" = 0 ] || "$PYTEST" -q -rs -p no:cacheprovider tests/gpu/test_gpu_weight_blocks.py tests/gpu/test_gpu_fp8.py
             JAX_CLUSTER_SANITIZE_LOGS="$LOGS" "$PYTEST" -q -rs -p no:cacheprovider -k weight_block tests/gpu/test_gpu_sanitizer.py
             "$PY" benchmarks/bench_fp8_weights.py --out "$LOGS"
             PYTHONPATH=$PWD/tests/stubs:${PYTHONPATH:-} "$PY" benchmarks/bench_moe_mlp.py --out "$LOGS" --fp8 \
               ${WEIGHTS_MOE_ARGS:---configs mixtral-8x22b,deepseek-v3 --routings skewed --micro-batches 4}; } 2>&1 | tee "$LOGS/fp8_weights.log" | tail -40 ;;
    train) step "examples: train_block at both sizes (jax_cluster vs flax) and expert_parallel"
           { "$PY" examples/train_block.py --out "$LOGS"
             "$PY" examples/train_block.py --size medium --steps ${MEDIUM_STEPS:-100} --out "$LOGS"
             "$PY" examples/expert_parallel.py --dtype bfloat16; } 2>&1 | tee "$LOGS/train.log" ;;
    fp8train) step "examples: train_block in the blockwise fp8 recipe against Flax's bf16"
           "$PY" examples/train_block.py --size ${FP8_TRAIN_SIZE:-medium} --fp8 --out "$LOGS" 2>&1 | tee "$LOGS/train_fp8.log" ;;
    traindp) step "examples: train_block data parallel over every GPU, bf16 and the fp8 recipe (needs two GPUs)"
           { "$PY" examples/train_block.py --data-parallel --size medium --steps ${MEDIUM_STEPS:-100} --out "$LOGS"
             "$PY" examples/train_block.py --data-parallel --size medium --fp8 --steps ${MEDIUM_STEPS:-100} --out "$LOGS"; } \
             2>&1 | tee "$LOGS/train_dp.log" ;;
    grid)  step "size grid"  # autotuning the reference dots would dominate its compile time
           XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0" "$PYTEST" -q -rs -s -p no:cacheprovider -k size_grid tests 2>&1 | tee "$LOGS/grid.log" | tail -25 ;;
  esac
  pack
done
step done
