"""Which registered model and experiment a registration goes to, the aliases, and reading an alias back."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from sentcl.registry.rules import GateConfig
from sentcl_mlflow.errors import unreachable
from sentcl_mlflow.store import EXPERIMENT

if TYPE_CHECKING:
    from mlflow import MlflowClient

CHALLENGER, CHAMPION = "challenger", "champion"


# `make serve` sets it on the worker (so its flow runs and their stages): they hold the registrar's account,
# which registers into the candidates model and never moves `champion`; the gate process judges from there.
REGISTRY_ROLE_ENV, REGISTRAR = "SENTCL_REGISTRY_ROLE", "registrar"


def as_registrar() -> bool:
    return os.environ.get(REGISTRY_ROLE_ENV, "") == REGISTRAR


def target_model_name(config: GateConfig) -> str:
    """The production model, except inside a DVC experiment (``dvc exp run``, ``make exp``), which registers
    into ``experiment_model_name`` unless ``SENTCL_REGISTER_PRODUCTION=1`` asks for production, and under
    ``make serve``'s worker (``SENTCL_REGISTRY_ROLE=registrar``), which registers into ``candidate_model_name``
    for the gate process to judge."""
    in_experiment = bool(os.environ.get("DVC_EXP_NAME"))
    asked = os.environ.get("SENTCL_REGISTER_PRODUCTION", "").lower() in ("1", "true", "yes")
    if in_experiment and not asked:
        return config.experiment_model_name
    return config.candidate_model_name if as_registrar() else config.model_name


# Production runs go to an experiment of their own, which `auth setup` makes editable by the gate's account
# only: in the shared experiment every teammate with EDIT could overwrite a production run's artifacts.
PRODUCTION_EXPERIMENT_SUFFIX = "-production"


def production_experiment(experiment: str = EXPERIMENT) -> str:
    return experiment + PRODUCTION_EXPERIMENT_SUFFIX


def run_experiment(model_name: str, config: GateConfig) -> str:
    """The experiment a registration's model run is logged in: the gate-only production experiment for the
    production model, the shared one for the experiments model (and anything else)."""
    return production_experiment() if model_name == config.model_name else EXPERIMENT


def move_champion(mlc: MlflowClient, name: str, target: str, lease: Any) -> None:  # a lease.Lease
    """``champion`` of ``name`` set to ``target`` right after the lease's fencing check (a holder whose lease was
    broken stops before the alias moves), then read back: another writer that bypassed the lease is an error."""
    lease.check()
    mlc.set_registered_model_alias(name, CHAMPION, str(target))
    after = version_or_none(mlc, name, CHAMPION)
    if after is None or str(after.version) != str(target):
        raise RuntimeError(
            f"champion of {name!r} reads back as {after.version if after else None} after moving it to "
            f"{target}: another writer bypassed the promotion lease"
        )


def utc_timestamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def mlflow_error_code(error: Exception) -> str:
    return str(getattr(error, "error_code", ""))


def version_or_none(mlc: MlflowClient, name: str, alias: str):
    from mlflow.exceptions import MlflowException

    try:
        return mlc.get_model_version_by_alias(name, alias)
    except MlflowException as e:
        if unreachable(e):  # a dead server is not "no champion": that would gate as if first ever
            raise
        return None
