#!/usr/bin/env bash
# The full test suite (installs what it needs into ./.venv first).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg
exec .venv/bin/python -m pytest -q "$@"
