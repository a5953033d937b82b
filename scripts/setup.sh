#!/usr/bin/env bash
# Makes .venv (Python >= 3.12), installs the build and test dependencies and
# builds jax_cluster into it. Kernels are built when nvcc is found (CUDACXX,
# PATH, /usr/local/cuda or the nvidia-cuda-nvcc wheel); JAX_CLUSTER_REQUIRE_KERNELS=1
# makes a build without them an error.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  "$(bash scripts/find_python.sh)" -m venv "$VENV"
fi
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install -q "jax>=0.11" numpy "nanobind>=2.0" "scikit-build-core>=0.10" \
  "nvidia-cutlass==4.2.0.0" pytest pytest-xdist nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm cmake ninja \
  flax optax `# jax_cluster.nn, its tests and examples/train_block.py` \
  ruff==0.17.6 mypy==2.4.1 clang-format==23.1.5  # scripts/lint.sh (pinned: formatters differ by version)
# tokamax's ragged_dot test base for tests/cpu/test_tokamax_conformance.py, without
# its profiler and tensorboard dependencies (tests/stubs stands in for xprof)
"$PY" -m pip install -q --no-deps tokamax==0.0.17 einshape==1.0 qwix==0.1.8 immutabledict==4.3.1 \
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
  chex==0.1.92 jaxtyping==0.3.11 wadler-lindig==0.1.8 toolz==1.2.0 tqdm==4.70.1

cuda=AUTO
[ "${JAX_CLUSTER_REQUIRE_KERNELS:-0}" = 1 ] && cuda=ON
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
# -v for the build's progress ("[jax_cluster] compiled unit 3/17 ..."): a first
# build with kernels takes several minutes; the full log is kept in build/.
log=build/setup-build.log
mkdir -p build
set +e
"$PY" -m pip install -v --no-build-isolation --no-deps -C "cmake.define.JAX_CLUSTER_CUDA=$cuda" \
  -C "cmake.define.JAX_CLUSTER_VARIANTS=${JAX_CLUSTER_VARIANTS:-}" \
  -C "cmake.define.JAX_CLUSTER_UNIT_SIZE=${JAX_CLUSTER_UNIT_SIZE:-12}" . 2>&1 |
  tee "$log" | grep --line-buffered -E '\[jax_cluster\]|jax_cluster: '
status=${PIPESTATUS[0]}
set -e
if [ "$status" != 0 ]; then tail -60 "$log"; exit "$status"; fi
"$PY" -P -c 'import jax_cluster; print(jax_cluster.info())'  # -P: the installed package, not the source tree
