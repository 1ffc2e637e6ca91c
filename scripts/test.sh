#!/usr/bin/env bash
# The full test suite in two tiers (installs what it needs into ./.venv first): the unit tier
# (hand-made inputs; under 3 minutes on two cores), then the integration tier (real data sets,
# the encoder, the pipeline, torchrun; tests/conftest.py says which tests are which). A failing
# unit tier stops the run before the integration tier. Extra arguments go to both tiers, e.g.
# `bash scripts/test.sh --durations=25` (as .ci/run does) or a test path.
set -euo pipefail
cd "$(dirname "$0")/.."
NEED_FREE_GB=${NEED_FREE_GB:-8}
bash scripts/bootstrap.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg
# Disk: the integration tier writes real stores and trained encoders with their checkpoints
# (a module holds up to ~6 GB; tests/conftest.py deletes each module's folders when it passes).
# pytest deletes the base folders of earlier, finished sessions (no .lock inside) only when this
# session ends (tmp_path_retention_count in pyproject.toml); on a machine reused by earlier runs
# they can fill the disk first, so they go now. A live session's folder (it has .lock) stays.
tmp_root=$(.venv/bin/python -c 'import getpass, os, tempfile
print(os.environ.get("PYTEST_DEBUG_TEMPROOT") or tempfile.gettempdir(), "pytest-of-" + getpass.getuser(), sep="/")')
for old in "$tmp_root"/pytest-[0-9]*; do
  if [ -d "$old" ] && [ ! -e "$old/.lock" ]; then rm -rf "$old"; fi
done
need_kb=$((NEED_FREE_GB * 1024 * 1024))
for place in "$(dirname "$tmp_root")" .; do
  free_kb=$(df -Pk "$place" | awk 'NR == 2 {print $4}')
  echo "== test.sh: $((free_kb / 1024)) MiB free for $place ($(df -Pk "$place" | awk 'NR == 2 {print $6}'))" >&2
  if [ "$free_kb" -lt "$need_kb" ]; then
    echo "test.sh: only $((free_kb / 1024)) MiB free on the disk of $place; the tests need" \
      "${NEED_FREE_GB} GiB (set NEED_FREE_GB to change the check)" >&2
    exit 1
  fi
done
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
