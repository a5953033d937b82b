#!/usr/bin/env bash
# The test command: builds into .venv (scripts/setup.sh) and runs pytest.
# GPU tests run when a Hopper/Blackwell GPU is present and skip otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${SETUP_DONE:-0}" = 1 ] || bash scripts/setup.sh
# the pytest entry point, not `python -m pytest`: the source tree must not
# shadow the installed package (it has no compiled extension).
# Without a GPU the tests are compile-bound: one worker per core (pytest-xdist).
# With one, they share the device and run in one process.
workers=()
nvidia-smi -L >/dev/null 2>&1 || workers=(-n auto)
exec .venv/bin/pytest -q -rs "${workers[@]}" "$@"
