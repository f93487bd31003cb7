"""The one layer that talks to MLflow; the stages and the flows both call it, sentcl never imports it.

- ``sentcl_mlflow.store``: where runs go (``tracking_uri``), the client (credentials, bounded waits);
- ``sentcl_mlflow.runs``: what a stage run records (``log_stage``, ``preflight``, ``log_pyfunc_run``);
- ``sentcl_mlflow.registry``: ``names``, ``lease`` (the promotion lease), ``versions``, ``gate`` (register-then-gate,
  promote, rollback), ``download`` (checked downloads).

The rules themselves are pure: ``sentcl.registry.rules`` (``GateConfig``, ``gate_decision``) and the checkpoint
choice, ``sentcl.training.selection``.
``python -m sentcl_mlflow`` prints the tracking URI in use. Import the submodule you need: this file
imports nothing, so a training stage that logs runs does not depend on the registry's code.
"""
