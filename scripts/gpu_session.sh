#!/usr/bin/env bash
# One call on a lent GPU machine: build with 16 jobs, then the steps in
# $STEPS (default: tests bench grid); every log lands in $OUT.
# Steps: tests checks selftest sharding lgemms bench grid planner sched layers ragged train.
# The machine has no network: carry the nvidia-cutlass wheel in .whl/ (see README).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/jax_cluster_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
step() { echo "== $(date +%T) $*"; }

if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1

# PREBUILT=DIR reuses an extension an earlier call built on this kind of
# machine (saved by that call in $OUT/prebuilt): the sources must not have
# changed in cc/ or variants.json since. It saves the build's minutes.
if [ -n "${PREBUILT:-}" ]; then
  step "prebuilt extension from $PREBUILT"
  cp "$PREBUILT"/_ext*.so jax_cluster/ && export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} || exit 1
else
  step build
  # Only the arch of the GPU at hand by default (ARCHS="sm90a;sm100a" for both): CI
  # builds and SASS-checks sm100a, and skipping it here saves device minutes.
  # VARIANTS=REGEX builds only the matching menu rows, for a quick measurement.
  if ! "$PY" -m pip install -v --no-build-isolation --no-deps -C cmake.define.JAX_CLUSTER_CUDA=ON \
      -C "cmake.define.JAX_CLUSTER_ARCHS=${ARCHS:-sm90a}" \
      -C "cmake.define.JAX_CLUSTER_VARIANTS=${VARIANTS:-}" \
      -C build-dir=/tmp/jax_cluster_build . >"$OUT/build.log" 2>&1; then
    tail -50 "$OUT/build.log"; exit 1
  fi
  grep -E "warning C7510|spill" "$OUT/build.log" | head -5
  mkdir -p "$OUT/prebuilt" && cp /tmp/jax_cluster_build/_ext*.so "$OUT/prebuilt/"
fi
(cd /tmp && "$PY" -c 'import jax_cluster; print(jax_cluster.info())') | tee "$OUT/info.txt"

PYTEST=$(dirname "$(command -v "$PY")")/pytest
for part in ${STEPS:-tests bench grid}; do
  case $part in
    tests) step "tests (all but the size grid)"
           "$PYTEST" -q -rs -p no:cacheprovider -k "not size_grid" tests 2>&1 | tee "$OUT/tests.log" | tail -25 ;;
    checks) step "self-test and the GPU test files, side by side (both are compile-bound)"
           export XLA_PYTHON_CLIENT_PREALLOCATE=false
           (cd /tmp && XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0" \
              "$PY" -m jax_cluster.selftest ${SELFTEST_ARGS:-}) >"$OUT/selftest.log" 2>&1 &
           "$PYTEST" -q -rs -p no:cacheprovider -k "not size_grid" tests/test_gpu_*.py \
              tests/test_nn.py tests/test_linear.py tests/test_ragged_dot.py \
              tests/test_autotune.py >"$OUT/gputests.log" 2>&1
           wait
           tail -n 15 "$OUT/gputests.log"; tail -n 5 "$OUT/selftest.log"
           unset XLA_PYTHON_CLIENT_PREALLOCATE ;;
    sharding) step "partitioning on every GPU of this machine (test_gpu_sharding needs two)"
           "$PYTEST" -q -rs -p no:cacheprovider tests/test_gpu_sharding.py 2>&1 | tee "$OUT/sharding.log" | tail -15 ;;
    bench) step benchmark
           "$PY" benchmarks/bench_matmul.py --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" ;;
    selftest) step "self-test (every compiled variant)"  # its reference dots need no autotuning
           (cd /tmp && XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0" \
              "$PY" -m jax_cluster.selftest ${SELFTEST_ARGS:-}) 2>&1 | tee "$OUT/selftest.log" | tail -60 ;;
    planner) step "planner vs exhaustive timing"
           "$PY" benchmarks/bench_planner.py --out "$OUT" 2>&1 | tee "$OUT/planner.log" | tail -25 ;;
    sched) step "schedules at boundary tile counts"
           "$PY" benchmarks/bench_schedules.py --out "$OUT" 2>&1 | tee "$OUT/sched.log" ;;
    layers) step "Flax layers against Flax's own (forward + backward)"
           "$PY" benchmarks/bench_layers.py --out "$OUT" ${LAYERS_ARGS:-} 2>&1 | tee "$OUT/layers.log" ;;
    lgemms) step "the three GEMMs of a Linear step, each against XLA"
           "$PY" benchmarks/bench_linear_gemms.py --out "$OUT" ${LGEMMS_ARGS:-} 2>&1 | tee "$OUT/lgemms.log" ;;
    ragged) step "ragged_dot benchmark"
           "$PY" benchmarks/bench_ragged.py --out "$OUT" ${RAGGED_ARGS:-} 2>&1 | tee "$OUT/ragged.log" ;;
    train) step "examples: train_block (jax_cluster vs flax) and expert_parallel"
           { "$PY" examples/train_block.py && "$PY" examples/expert_parallel.py --dtype bfloat16; } \
             2>&1 | tee "$OUT/train.log" ;;
    grid)  step "size grid"  # autotuning the reference dots would dominate its compile time
           XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0" "$PYTEST" -q -rs -s -p no:cacheprovider -k size_grid tests 2>&1 | tee "$OUT/grid.log" | tail -25 ;;
  esac
done
step done
