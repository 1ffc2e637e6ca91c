#!/usr/bin/env bash
# The full test suite in two tiers (installs what it needs into ./.venv first): the unit tier
# (hand-made inputs; under 3 minutes on two cores), then the integration tier (real data sets,
# the encoder, the pipeline, torchrun; tests/conftest.py says which tests are which). A failing
# unit tier stops the run before the integration tier. Extra arguments go to both tiers, e.g.
# `bash scripts/test.sh --durations=25` (as .ci/run does) or a test path.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg
bash scripts/disk_check.sh  # stale pytest folders go, then NEED_FREE_GB is checked
tier() {  # tier NAME MARK ARGS...: exit code 5 (no test of this tier selected) is not a failure
  local name=$1 mark=$2 rc=0
  shift 2
  echo "== test.sh: $name tier (-m '$mark')" >&2
  .venv/bin/python -m pytest -q -m "$mark" "$@" || rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then
    echo "test.sh: FAILED in the $name tier (pytest exit $rc)" >&2
    exit "$rc"
  fi
}
tier unit "not integration" "$@"
tier integration "integration" "$@"
echo "test.sh: both tiers passed" >&2
