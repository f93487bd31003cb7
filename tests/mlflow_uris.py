"""Where MLflow sends a test process's requests, put back when a fixture's server goes.

``sentcl_mlflow.store.client()`` calls ``mlflow.set_tracking_uri`` and ``mlflow.set_registry_uri``, which set
MLflow's process-wide URIs and export ``MLFLOW_TRACKING_URI`` / ``MLFLOW_REGISTRY_URI``. A fixture that only
restored ``MLFLOW_TRACKING_URI`` after its server stopped left the registry URI on that dead server, and a
later test's ``models:/...`` look-up went there (connection refused). :func:`mlflow_pointed_at` saves and
restores all of it: the variables, MLflow's two process-wide URIs and the store's memo of its last check."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

NAMES = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


@contextmanager
def mlflow_pointed_at(uri: str, auth: tuple[str, str] | None = None, registry: bool = False) -> Iterator[str]:
    """MLFLOW_TRACKING_URI (and MLFLOW_REGISTRY_URI with ``registry``, the credentials with ``auth``) set to
    ``uri`` inside; on exit every name in :data:`NAMES` and MLflow's process-wide URIs are what they were."""
    import mlflow
    from mlflow.tracking._model_registry import utils as registry_utils
    from mlflow.tracking._tracking_service import utils as tracking_utils

    from sentcl_mlflow import store

    saved_env = {name: os.environ.get(name) for name in NAMES}
    saved = (tracking_utils._tracking_uri, registry_utils._registry_uri, store._configured)
    os.environ["MLFLOW_TRACKING_URI"] = uri
    if registry:
        os.environ["MLFLOW_REGISTRY_URI"] = uri
        mlflow.set_tracking_uri(uri)
        mlflow.set_registry_uri(uri)
    if auth is not None:
        os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"] = auth
    try:
        yield uri
    finally:
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        # MLflow has no public way to unset these; writing them back is the only way to forget a dead server.
        tracking_utils._tracking_uri, registry_utils._registry_uri, store._configured = saved
