"""treerank.forest: the TreeRank forest, one package (model, config, training, index, kernels).

``M`` query/passage classifier pairs; a passage's score for a query is the number of models
whose classes agree (docs/forest.md). Layer ``forest`` (docs/DESIGN.md): above ``search``, it
may import search, training, models, store, kernels and metrics; nothing below imports it, and
generic code reaches it only through its family entry (``treerank.families``).
"""
