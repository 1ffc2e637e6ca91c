"""treerank.search"""
