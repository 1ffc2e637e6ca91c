#!/usr/bin/env bash
# The main job end to end on the bundled real samples (SciFact train->test, MS MARCO v2.1 sample).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg
exec .venv/bin/treerank run configs/sample.yaml "$@"
