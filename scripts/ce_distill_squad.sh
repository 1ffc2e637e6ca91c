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
# the teacher: the finished cross-encoder, or with TEACHER_STEP=N its step-N checkpoint (a CPU
# budget: the model at step N of the 1,200-step schedule, its learning rate not yet decayed)
TEACHER=runs/ce-squad/teacher
if [ -n "${TEACHER_STEP:-}" ]; then
  SRC=runs/ce-squad/ce/checkpoints/checkpoint-$TEACHER_STEP
  [ -f "$SRC/model.safetensors" ] || { echo "no $SRC: train until step $TEACHER_STEP" >&2; exit 1; }
else
  SQUAD=stores/squad THREADS=$THREADS ONLY_TRAIN=1 bash scripts/ce_squad_cpu.sh
  SRC=runs/ce-squad/ce/model
fi
if [ ! -f "$TEACHER/model.safetensors" ]; then
  rm -rf "$TEACHER.tmp" && mkdir -p "$TEACHER.tmp"
  for f in "$SRC"/*; do  # the model's files, not the trainer's optimizer state
    case "$(basename "$f")" in optimizer.pt|scheduler.pt|rng_state.pth|training_args.bin) ;;
      *) cp -r "$f" "$TEACHER.tmp/" ;; esac
  done
  mv "$TEACHER.tmp" "$TEACHER"
fi
OMP_NUM_THREADS=$THREADS /usr/bin/time -v -o runs/distill-squad.time \
  "$TR" run configs/distill_squad.yaml 2>&1 | tee runs/distill-squad.log
.venv/bin/python scripts/experiments/distill_squad_report.py runs/distill-squad/eval/squad \
  "$TEACHER" "${RESULT:-docs/results/distill_squad.json}"
