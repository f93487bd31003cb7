"""The registry's rules with no I/O (the gate, what blocks a promotion) and the release folder a version ships.

Imports ``sentcl.model``, ``sentcl.evaluation`` and ``sentcl.training.selection`` (the checkpoint the release
ships is chosen there, the one home of checkpoint selection); ``sentcl.training`` never imports the registry.
"""
