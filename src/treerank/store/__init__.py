"""treerank.store"""
