#!/usr/bin/env bash
# Issue 32's distillation and denoising measurement (configs/distill_squad.yaml,
# docs/cross_encoder.md): the SQuAD store, the SQuAD cross-encoder (scripts/ce_squad_cpu.sh,
# training only), then `treerank run` of the five linear heads, timed, and
# scripts/experiments/distill_squad_report.py writes docs/results/distill_squad.json (paired
# tests, every metric checked against ir_measures on the run files).
#
#   bash scripts/ce_distill_squad.sh            # THREADS=2 for two torch threads
#
# Each step is skipped when its output is complete (the store's meta.json, the cross-encoder's
# results.json; `treerank run` reuses its finished stages).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg
THREADS=${THREADS:-1}
TR=.venv/bin/treerank
if [ ! -f stores/squad/dev/meta.json ]; then
  "$TR" embed ../shared/data/squad-v1.1/squad-v1.1.zip -f beir --split train --split dev \
    -o stores/squad --backend torch --precision fp32 --threads "$THREADS"
fi
SQUAD=stores/squad THREADS=$THREADS ONLY_TRAIN=1 bash scripts/ce_squad_cpu.sh
OMP_NUM_THREADS=$THREADS /usr/bin/time -v -o runs/distill-squad.time \
  "$TR" run configs/distill_squad.yaml 2>&1 | tee runs/distill-squad.log
.venv/bin/python scripts/experiments/distill_squad_report.py runs/distill-squad/eval/squad \
  runs/ce-squad/ce "${RESULT:-docs/results/distill_squad.json}"
