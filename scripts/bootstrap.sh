#!/usr/bin/env bash
# Create ./.venv with every pinned dependency (CPU torch 2.13.0) and treerank installed editable.
# Idempotent: re-runs only when pyproject.toml or constraints.txt changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp=.venv/.treerank-stamp
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
echo "bootstrap: creating .venv (pinned deps from constraints.txt, CPU torch 2.13.0)" >&2
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -c constraints.txt torch==2.13.0
.venv/bin/python -m pip install -q -c constraints.txt -e '.[dev]'
echo "$want" > "$stamp"
