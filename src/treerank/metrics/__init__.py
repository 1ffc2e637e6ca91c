"""``treerank.metrics``."""
