"""treerank.diagnostics"""
