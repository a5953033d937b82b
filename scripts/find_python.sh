#!/usr/bin/env bash
# Prints the path of a Python >= 3.12 (jax >= 0.11 needs it): $PYTHON if it
# qualifies, else python3.1x on PATH, else a pyenv-installed one.
set -euo pipefail

ok() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; }

for cand in "${PYTHON:-}" python3 python3.13 python3.12; do
  if [ -n "$cand" ] && command -v "$cand" >/dev/null && ok "$(command -v "$cand")"; then
    command -v "$cand"; exit 0
  fi
done
for root in "${PYENV_ROOT:-$HOME/.pyenv}"; do
  for cand in $(ls -d "$root"/versions/3.1[2-9]*/bin/python3 2>/dev/null | sort -rV); do
    if ok "$cand"; then echo "$cand"; exit 0; fi
  done
done
echo "no Python >= 3.12 found: install one (pyenv install 3.12) or set PYTHON" >&2
exit 1
