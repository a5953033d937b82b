#!/usr/bin/env bash
# The main job: on a CUDA GPU, the matmul benchmark against XLA; without one,
# a demo of the planner and the XLA fallback.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if .venv/bin/python -c 'import jax, sys; sys.exit(jax.default_backend() != "gpu")' 2>/dev/null; then
  .venv/bin/pip install -q matplotlib
  exec .venv/bin/python benchmarks/bench_matmul.py --out "${OUT_DIR:-benchmarks/results/local}"
fi
exec .venv/bin/python examples/demo.py
