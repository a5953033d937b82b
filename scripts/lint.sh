#!/usr/bin/env bash
# Lint and format checks, as CI runs them: ruff (lint + format) over the
# Python, clang-format over cc/, mypy over the planning package. Uses the
# tools scripts/setup.sh pins in .venv; FIX=1 rewrites instead of checking.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${VENV:-.venv}/bin
PY_DIRS=(jax_cluster tests benchmarks examples cc/gen_contract.py cc/gen_variants.py cc/compile_progress.py)
mapfile -t CC_FILES < <(git ls-files 'cc/*.cc' 'cc/*.h' 'cc/*.cuh')
if [ "${FIX:-0}" = 1 ]; then
  "$BIN/ruff" check --fix "${PY_DIRS[@]}"
  "$BIN/ruff" format "${PY_DIRS[@]}"
  "$BIN/clang-format" -i "${CC_FILES[@]}"
else
  "$BIN/ruff" check "${PY_DIRS[@]}"
  "$BIN/ruff" format --check "${PY_DIRS[@]}"
  "$BIN/clang-format" --dry-run -Werror "${CC_FILES[@]}"
fi
"$BIN/mypy" jax_cluster/planning
echo "lint: clean"
