"""treerank.diagnostics: the DRT seed's four-step diagnostic procedure, reusable for any model.

* :mod:`~treerank.diagnostics.variants`: scoring variants of one DRT checkpoint (no retraining);
* :mod:`~treerank.diagnostics.probes` (+ :mod:`~treerank.diagnostics.labels`): linear probes;
* :mod:`~treerank.diagnostics.failures`: per-query wins / losses between any two systems;
* :mod:`~treerank.diagnostics.cka`: linear CKA between any two representations;
* :mod:`~treerank.diagnostics.procedure`: :func:`run_diagnostics`, all four plus the decision
  rules; :mod:`~treerank.diagnostics.report`: the Markdown report and plots.
"""

from treerank.diagnostics.procedure import run_diagnostics

__all__ = ["run_diagnostics"]
