#!/usr/bin/env bash
# The fine-tune GPU recipe (issue 35), sized to one 15-minute device slot on one CUDA GPU:
#   1. embed SQuAD v1.1 train + dev with the frozen encoder        (~1-2 min on an H200)
#   2. query tower: one epoch over the 87,599 training questions,   (softmax over all 20,963
#      re-embed the questions, evaluate on the 10,570 dev ones       paragraphs; ~1-3 min)
#   3. bi-encoder: a capped budget (configs/finetune/squad_biencoder.yaml, bf16), re-embed
#      questions and paragraphs, evaluate                            (~3-6 min)
#   4. drift of each tuned dev store against the frozen one, and a summary JSON
# Each step runs under its own time limit, so an overrun stops that step, not the slot.
#
#   scripts/finetune_gpu.sh [--out DIR] [--data DIR] [--device cuda] [--dry-run]
#   scripts/finetune_gpu.sh --self-test [--out DIR] [--dry-run]
#
# --self-test: the same steps on CPU on a tiny SciFact slice (the first 32 claims of train
#   and of test, at most 300 abstracts) with 3 training steps each: checks the recipe end to end in under
#   3 minutes on one core, no GPU needed.
# --dry-run: print the plan (one "PLAN <step>: <command>" line per step) and exit 0; nothing
#   is read or written.
# Exit codes: 0 done, 2 bad arguments or no CUDA device (GPU mode), else the failing step's.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; }

self_test=0 dry=0 device=cuda out="" data="${TREERANK_SHARED_DATA:-../shared/data}"
while [ $# -gt 0 ]; do
  case "$1" in
    --self-test) self_test=1 ;;
    --dry-run) dry=1 ;;
    --out) [ $# -ge 2 ] || { echo "error: --out needs a folder" >&2; exit 2; }; out="$2"; shift ;;
    --data) [ $# -ge 2 ] || { echo "error: --data needs a folder" >&2; exit 2; }; data="$2"; shift ;;
    --device) [ $# -ge 2 ] || { echo "error: --device needs a value" >&2; exit 2; }; device="$2"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

PY="${PYTHON:-python}"
if [ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ]; then PY=.venv/bin/python; fi
# the treerank CLI from this checkout (no install needed: PYTHONPATH=src)
TR=("$PY" -c 'import sys; from treerank.cli.main import app; sys.argv[0] = "treerank"; app()')
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

if [ "$self_test" = 1 ]; then
  device=cpu
  out="${out:-runs/finetune-gpu-selftest}"
  zip="$data/beir-scifact/scifact.zip"
  embed_args=(-f scifact --split train --split test --limit 32 --max-passages 300 --threads 1)
  train_split=train eval_split=test
  qt_cfg=configs/finetune/scifact_query_tower.yaml
  bi_cfg=configs/finetune/scifact_biencoder.yaml
  limit_embed=900 limit_qt=900 limit_bi=900 limit_drift=300  # a loaded CPU: generous
  # 3 steps of batch 8 on one thread, 128-token passages: the recipe, not the numbers
  override='{"data": {"batch_size": 8, "epochs": 1}, "trainer": {"max_steps": 3, "save_steps": 3, "threads": 1}, "model": {"max_passage_length": 128}}'
  perms=200
else
  out="${out:-runs/finetune-gpu}"
  zip="$data/squad-v1.1/squad-v1.1.zip"
  embed_args=(-f beir --split train --split dev --device "$device")
  train_split=train eval_split=dev
  qt_cfg=configs/finetune/squad_query_tower.yaml
  bi_cfg=configs/finetune/squad_biencoder.yaml
  limit_embed=150 limit_qt=200 limit_bi=240 limit_drift=40
  override='{}'
  perms=10000
fi
store="$out/store"

# one line per step: name, time limit (s), command
plan=()
add() { plan+=("$1|$2|${*:3}"); }
add embed "$limit_embed" "treerank embed $zip -o $store ${embed_args[*]} --overwrite"
add config "20" "$PY -c <derive $out/qt.yaml and $out/bi.yaml from $qt_cfg and $bi_cfg with $override>"
for arm in qt bi; do
  limit="limit_$arm"
  add "finetune-$arm" "${!limit}" "treerank finetune $out/$arm.yaml --store $store -o $out/$arm --train-split $train_split --eval-split $eval_split --device $device --permutations $perms --no-progress"
  add "drift-$arm" "$limit_drift" "treerank drift $store/$eval_split $out/$arm/stores/$eval_split --k 10"
done
add summary "20" "$PY -c <write $out/summary.json from $out/qt/results.json and $out/bi/results.json>"

if [ "$dry" = 1 ]; then
  echo "mode: $([ "$self_test" = 1 ] && echo self-test || echo gpu) device: $device out: $out"
  for p in "${plan[@]}"; do
    IFS='|' read -r name limit cmd <<<"$p"
    echo "PLAN $name (limit ${limit}s): $cmd"
  done
  exit 0
fi

[ -f "$zip" ] || { echo "error: $zip: missing (set --data or TREERANK_SHARED_DATA)" >&2; exit 2; }
if [ "$self_test" = 0 ]; then
  "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 2)" || {
    echo "error: no CUDA device here; run --self-test on a CPU" >&2; exit 2; }
fi
mkdir -p "$out"

derive() {  # derive SRC DEST JSON-OVERRIDE: the config with the override merged in
  "$PY" - "$1" "$2" "$3" <<'EOF'
import json, sys
import yaml
src, dest, override = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
doc = yaml.safe_load(open(src, encoding="utf-8"))
for section, values in override.items():
    doc.setdefault(section, {}).update(values)
with open(dest, "w", encoding="utf-8") as f:
    yaml.safe_dump(doc, f, sort_keys=False)
EOF
}

run_step() {  # run_step NAME LIMIT CMD...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "== $name (limit ${limit}s): $*" >&2
  set +e
  timeout --signal=INT --kill-after=20 "$limit" "$@"
  local rc=$?
  set -e
  echo "== $name: rc $rc, $((SECONDS - t0)) s" >&2
  echo "{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $((SECONDS - t0))}" >>"$out/steps.jsonl"
  [ "$rc" = 0 ] || { echo "error: step $name failed (rc $rc)" >&2; exit "$rc"; }
}

: >"$out/steps.jsonl"
run_step embed "$limit_embed" "${TR[@]}" embed "$zip" -o "$store" "${embed_args[@]}" --overwrite
derive "$qt_cfg" "$out/qt.yaml" "$override"
derive "$bi_cfg" "$out/bi.yaml" "$override"
for arm in qt bi; do
  rm -rf "${out:?}/$arm"
  limit="limit_$arm"
  run_step "finetune-$arm" "${!limit}" "${TR[@]}" finetune "$out/$arm.yaml" --store "$store" \
    -o "$out/$arm" --train-split "$train_split" --eval-split "$eval_split" --device "$device" \
    --permutations "$perms" --no-progress
  run_step "drift-$arm" "$limit_drift" "${TR[@]}" drift "$store/$eval_split" \
    "$out/$arm/stores/$eval_split" --k 10
done
"$PY" - "$out" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
summary = {}
for arm in ("qt", "bi"):
    res = json.loads((out / arm / "results.json").read_text(encoding="utf-8"))
    name = f"finetune-{res['family']}"
    summary[res["family"]] = {
        "ndcg@10": res["systems"][name]["ndcg@10"],
        "cosine_ndcg@10": res["systems"]["cosine"]["ndcg@10"],
        "vs_cosine": res["paired_vs_cosine"]["ndcg@10"],
        "train_wall_seconds": res["cost"]["train"]["wall_seconds"],
        "steps": res["training"]["steps"],
    }
(out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
print(json.dumps(summary, indent=1))
EOF
echo "done: $out/summary.json" >&2
