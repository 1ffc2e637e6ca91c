"""treerank.readers"""
