"""treerank.encoders"""
