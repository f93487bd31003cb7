"""Session-wide test settings: no test writes to the repository's own MLflow store."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _scratch_mlflow_store(tmp_path_factory):
    """Stages log to MLflow at their end; in tests that is a scratch sqlite store unless a test points
    MLFLOW_TRACKING_URI somewhere else (the registry tests start a real server)."""
    previous = os.environ.get("MLFLOW_TRACKING_URI")
    if previous is None:
        store = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{store}"
    yield
    if previous is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
