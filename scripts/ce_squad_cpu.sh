#!/usr/bin/env bash
# Issue 32's CPU measurement (docs/cross_encoder.md): train a cross-encoder on SQuAD train
# questions (configs/finetune/squad_cross_encoder.yaml), then rerank BM25's top 20 on a seeded
# 1,000-question sample of SQuAD dev (against all of the split's passages), paired against BM25
# on the same questions. Both commands are timed (/usr/bin/time: CPU seconds, peak RSS) and
# scripts/experiments/ce_squad_report.py writes docs/results/cross_encoder_squad_cpu.json.
#
#   SQUAD=/path/to/squad-store-root bash scripts/ce_squad_cpu.sh
#
# SQUAD: a store root with train/ and dev/ (treerank embed of squad-v1.1.zip); it is copied to
# stores/squad-ce first (mining writes a sidecar into the train split). One thread, niced.
# N: questions in the dev sample (default 1000); ONLY_TRAIN=1 stops after the training; a
# finished training run in RUN/ce is reused. THREADS (default 1): torch threads of both commands
# (the config's trainer.threads is rewritten into RUN/config.yaml when it is not 1).
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${THREADS:-1}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
SQUAD=${SQUAD:?set SQUAD to a SQuAD store root holding train/ and dev/}
STORE=${STORE:-stores/squad-ce}
RUN=${RUN:-runs/ce-squad}
DEV=${DEV:-dev}
N=${N:-1000}
CONFIG=${CONFIG:-configs/finetune/squad_cross_encoder.yaml}
TR=.venv/bin/treerank
if [ ! -f "$STORE/train/meta.json" ]; then
  rm -rf "$STORE.tmp" && mkdir -p "$STORE.tmp"
  cp -r "$SQUAD/train" "$SQUAD/$DEV" "$STORE.tmp/"
  mv "$STORE.tmp" "$STORE"
fi
mkdir -p "$RUN"
if [ "$THREADS" != 1 ]; then  # the same config at another thread count
  sed -E "s/^(  threads: )1( |$)/\1$THREADS\2/" "$CONFIG" > "$RUN/config.yaml"
  CONFIG=$RUN/config.yaml
fi
if [ ! -f "$RUN/ce/results.json" ]; then  # a finished training run is kept (rerun: rerank only)
  /usr/bin/time -v -o "$RUN/time_train.txt" nice -n 5 "$TR" finetune \
    "$CONFIG" --store "$STORE" -o "$RUN/ce" --no-progress \
    2>&1 | tee "$RUN/train.log"
fi
[ -n "${ONLY_TRAIN:-}" ] && exit 0
/usr/bin/time -v -o "$RUN/time_rerank.txt" nice -n 5 "$TR" evaluate --store "$STORE/$DEV" \
  --system bm25 --system "rescore:bm25:depth=20,scorer=ce:$RUN/ce/model,precision=auto" --baseline bm25 \
  --k 20 --metric ndcg@10 --metric mrr@10 --metric recall@20 --sample-queries "$N" \
  --sample-seed 0 --no-progress -o "$RUN/eval" --overwrite \
  2>&1 | tee "$RUN/eval.log"
.venv/bin/python scripts/experiments/ce_squad_report.py "$RUN" "$N" \
  "${RESULT:-docs/results/cross_encoder_squad_cpu.json}"
