"""treerank.pipeline"""
