"""treerank.kernels: pure array kernels (exact streaming top-k, vector normalisation).

The lowest layer above the base helpers: plain NumPy / torch / FAISS functions that know no
store, model or dataset, so that every layer (training's negative mining included) can use them.
"""
