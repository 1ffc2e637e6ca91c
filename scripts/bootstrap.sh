#!/usr/bin/env bash
# Create ./.venv with every pinned dependency (CPU torch 2.13.0) and treerank installed editable.
# Idempotent: re-runs only when pyproject.toml or constraints.txt changed. Fails loudly.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp=.venv/.treerank-stamp
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
echo "bootstrap: installing pinned dependencies into .venv (first run: a minute or two)" >&2
[ -x .venv/bin/python ] || "$PY" -m venv .venv
log=.venv/bootstrap.log
: > "$log"
run() {
  if ! "$@" >>"$log" 2>&1; then
    echo "bootstrap: FAILED: $*" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
}
run .venv/bin/python -m pip install --upgrade pip
# torch first and alone: the pinned CPU build, never the multi-GB CUDA one.
run .venv/bin/python -m pip install -c constraints.txt torch==2.13.0
run .venv/bin/python -m pip install -c constraints.txt -e '.[dev]'
.venv/bin/python -c "import torch, treerank; assert torch.__version__.startswith('2.13.0'), torch.__version__" \
  || { echo "bootstrap: FAILED: wrong torch in .venv" >&2; exit 1; }
echo "$want" > "$stamp"
echo "bootstrap: done (log: $log)" >&2
