"""treerank.training"""
