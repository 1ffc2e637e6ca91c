#!/usr/bin/env bash
# The disk check scripts/test.sh runs before its tiers. The integration tier writes real stores
# and trained encoders with their checkpoints (4.4 GB at once at its peak; tests/conftest.py
# deletes each module's folders when it passes), so a run needs NEED_FREE_GB (default 6 GiB)
# free where pytest and the checkout write; else this exits 1 and says so, before any test.
# pytest deletes the base folders of earlier, finished sessions (no .lock inside) only when a
# session ends (tmp_path_retention_count in pyproject.toml); on a machine reused by earlier runs
# they can fill the disk first, so they go now. A live session's folder (it has .lock) stays.
# PYTHON (default .venv/bin/python) names the interpreter that finds pytest's folder.
set -euo pipefail
cd "$(dirname "$0")/.."
need_gb=${NEED_FREE_GB:-6}
tmp_root=$("${PYTHON:-.venv/bin/python}" -c 'import getpass, os, tempfile
print(os.environ.get("PYTEST_DEBUG_TEMPROOT") or tempfile.gettempdir(), "pytest-of-" + getpass.getuser(), sep="/")')
for old in "$tmp_root"/pytest-[0-9]*; do
  if [ -d "$old" ] && [ ! -e "$old/.lock" ]; then rm -rf "$old"; fi
done
need_kb=$((need_gb * 1024 * 1024))
for place in "$(dirname "$tmp_root")" .; do
  free_kb=$(df -Pk "$place" | awk 'NR == 2 {print $4}')
  echo "== disk_check: $((free_kb / 1024)) MiB free for $place ($(df -Pk "$place" | awk 'NR == 2 {print $6}'))" >&2
  if [ "$free_kb" -lt "$need_kb" ]; then
    echo "disk_check: only $((free_kb / 1024)) MiB free on the disk of $place; the tests need" \
      "$need_gb GiB (set NEED_FREE_GB to change the check)" >&2
    exit 1
  fi
done
