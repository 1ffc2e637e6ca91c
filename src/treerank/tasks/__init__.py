"""The one library call behind each command: what the CLI command and the pipeline stage both call.

A thin layer above families, evaluation and diagnostics and below the pipeline, so that
``treerank <command>`` and the stage of ``treerank run`` that does the same work share one
function (and its typed settings) instead of each repeating the other's glue:

* :mod:`.embed`: ``treerank embed`` and the ``embed:`` stage (:class:`~.embed.EncoderSettings`,
  :func:`~.embed.embed`);
* :mod:`.train`: ``treerank train`` and the ``train:`` stage (:func:`~.train.train_model`, with
  the held-out validator and the mining, pseudo-split and teacher preparation it runs first);
* :mod:`.evaluate`: ``treerank evaluate`` and the ``evaluate:`` stage (:func:`~.evaluate.evaluate`:
  ``resolve_evaluation``, then ``compare_systems`` under ``launch()``);
* :mod:`.diagnose`: the ``diagnose:`` stage and ``treerank diagnose`` (:func:`~.diagnose.diagnose`).

Nothing here decides what a lower layer decides: these functions only open, resolve and chain.
"""
