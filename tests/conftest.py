"""Session-wide test settings (no test writes to the repository's own MLflow store) and the tiny encoders
the training tests share; a module that needs another tiny model defines its own fixture of the same name."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sentcl.params import forget_process_params
from tests.tiny import make_tiny_encoder


@pytest.fixture(autouse=True)
def _fresh_process_params():
    """An entry point run in-process by one test (``transfer.main([...])``) leaves its params as the process's;
    the next test starts as a fresh process does."""
    yield
    forget_process_params()


@pytest.fixture(scope="session", autouse=True)
def _scratch_mlflow_store(tmp_path_factory):
    """Stages log to MLflow at their end; in tests that is a scratch sqlite store unless a test points
    MLFLOW_TRACKING_URI somewhere else (the registry tests start a real server). The session is the test
    process's entry point: its MLflow requests are bounded by the checkout's params.yaml ``tracking:``, as a
    stage's are by its own (``sentcl_mlflow.store.bound_requests``)."""
    from sentcl.params import read_params
    from sentcl_mlflow.store import HTTP_ENV, TrackingConfig, bound_requests

    saved = {name: os.environ.get(name) for name in ("MLFLOW_TRACKING_URI", *HTTP_ENV.values())}
    if saved["MLFLOW_TRACKING_URI"] is None:
        store = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{store}"
    bound_requests(TrackingConfig.from_params(read_params()))
    forget_process_params()
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A tiny BERT sentence-transformers folder with dropout (two passes differ), fresh per test module."""
    return make_tiny_encoder(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def still_model(tmp_path_factory):
    """The same without dropout: the only randomness left is the views'."""
    return make_tiny_encoder(tmp_path_factory.mktemp("still"), dropout=0.0)


def pytest_collection_modifyitems(items):
    """Tests under tests/services start real servers (MLflow, Prefect, a DVC repository): marked ``services``,
    so ``pytest -m "not services"`` runs the rest in a few minutes."""
    for item in items:
        if "services" in item.path.relative_to(Path(__file__).parent).parts[:1]:
            item.add_marker(pytest.mark.services)
