"""Training: the config, views, losses, objectives (``objectives/``: one module a family, one factory), the
trainer, its data and its runs, the teacher stage's work.

Imports ``sentcl.data``, ``sentcl.model`` and ``sentcl.evaluation``.
"""
