"""treerank.models"""
