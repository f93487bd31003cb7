"""The registry's rules with no I/O (the gate, the checkpoint choice) and the release folder a version ships.

Imports ``sentcl.model`` and ``sentcl.evaluation``; nothing of training.
"""
