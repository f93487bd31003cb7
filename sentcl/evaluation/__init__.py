"""Evaluation: Spearman of cosines, the seven-task STS benchmark and its dev splits, model folders scored, the
papers' analyses of a representation space.

Imports ``sentcl.data`` and ``sentcl.model``; nothing of training.
"""
