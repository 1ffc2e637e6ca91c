"""Crash points for tests: ``TREERANK_CRASH_AT=<stage kind>:<point>`` kills the process there.

:func:`crash_point` is placed at a few chosen points of each stage of ``treerank run`` (see
``docs/DESIGN.md``, "Crash hook"); when the environment variable names that point the process
ends at once with :data:`CRASH_EXIT_CODE` through ``os._exit`` (no ``finally`` blocks, no atexit
handlers, no flushing of open files: what a power cut or ``kill -9`` leaves behind). The crash
test (``tests/pipeline/test_crash.py``) re-runs the experiment after each crash and checks that
the report equals an uninterrupted run's. Without the variable a call costs one dictionary
lookup.
"""

from __future__ import annotations

import os

ENV = "TREERANK_CRASH_AT"
CRASH_EXIT_CODE = 97

__all__ = ["CRASH_EXIT_CODE", "ENV", "crash_point"]


def crash_point(stage: str, point: str) -> None:
    """End the process (``os._exit(97)``) when ``TREERANK_CRASH_AT`` equals ``"<stage>:<point>"``.

    Args:
        stage: the stage kind (``embed``, ``mining``, ``train``, ``evaluate``, ``diagnose``,
            ``report``).
        point: the point inside it (``mid``, ``before-meta``, ``after-weights``, ...).
    """
    want = os.environ.get(ENV)
    if want is not None and want == f"{stage}:{point}":
        os._exit(CRASH_EXIT_CODE)
