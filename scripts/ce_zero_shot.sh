#!/usr/bin/env bash
# Issue 32's zero-shot measurement (docs/cross_encoder.md): the SQuAD-trained cross-encoder
# reranks the top 50 of `rrf:bm25+cosine` on another collection's split, against every passage
# of that split, paired against the first stage on the same queries. Timed (/usr/bin/time: CPU
# seconds, peak RSS); scripts/experiments/ce_zero_shot_report.py writes
# docs/results/cross_encoder_zero_shot_<NAME>.json.
#
#   CE=runs/ce-squad/ce STORE=stores/scifact/test NAME=scifact bash scripts/ce_zero_shot.sh
#
# CE: a `treerank finetune` cross-encoder run (its model/ and results.json); STORE: the split
# to rerank (its vectors serve the cosine half of the first stage); NAME: the results' name.
# DEPTH (default 50): candidates reranked per query. One thread, niced.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
CE=${CE:?set CE to a cross-encoder run folder (treerank finetune ... -o CE)}
STORE=${STORE:?set STORE to the store split to rerank}
NAME=${NAME:?set NAME, the results name (scifact, dl19, ...)}
DEPTH=${DEPTH:-50}
RUN=${RUN:-runs/ce-zero-shot/$NAME}
TR=.venv/bin/treerank
FIRST="rrf:bm25+cosine"
mkdir -p "$RUN"
/usr/bin/time -v -o "$RUN/time_rerank.txt" nice -n 5 "$TR" evaluate --store "$STORE" \
  --system bm25 --system cosine --system "$FIRST" \
  --system "rescore:$FIRST:depth=$DEPTH,scorer=ce:$CE/model,precision=auto" --baseline "$FIRST" \
  --k "$DEPTH" --metric ndcg@10 --metric mrr@10 --metric "recall@$DEPTH" --no-progress \
  -o "$RUN/eval" --overwrite 2>&1 | tee "$RUN/eval.log"
.venv/bin/python scripts/experiments/ce_zero_shot_report.py "$CE" "$RUN" "$NAME" "$DEPTH" \
  "${RESULT:-docs/results/cross_encoder_zero_shot_$NAME.json}"
