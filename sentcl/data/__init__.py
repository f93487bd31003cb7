"""Data: SentEval's files read and fetched, the validate stage's rules, the built-in transfer texts, domain text.

Imports nothing of sentcl but ``sentcl.params``.
"""
