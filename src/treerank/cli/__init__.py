"""treerank.cli"""
