"""treerank.evaluation"""
