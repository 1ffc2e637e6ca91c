#!/usr/bin/env bash
# The device check (issue 26): CPU-vs-GPU agreement of embed, exact search, one head epoch and
# one forest pair, with GPU/CPU throughput ratios, in under 5 minutes on one CUDA GPU.
# No install, no network: PYTHONPATH=src, any torch 2.x (+ transformers for the embed part);
# every input is generated. Without CUDA the CPU halves run and the GPU parts say SKIPPED.
#   scripts/gpu_check.sh [--out gpu_check.json] [--quick] [--only embed,search,head,forest]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
if [ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ]; then PY=.venv/bin/python; fi
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec "$PY" bench/gpu_check.py "$@"
