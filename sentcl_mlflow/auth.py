"""Accounts and permissions of an MLflow server running the basic-auth app (``make serve``, compose).

    python -m sentcl_mlflow.auth setup      # as the admin: MLFLOW_TRACKING_USERNAME/PASSWORD = the admin's

MLflow has no permission per alias, so the production registered model (``registry.model_name``) is
editable by the gate's account only: everyone else reads it (the server's ``default_permission = READ``)
and cannot move ``champion``. ``setup`` is idempotent and reads every secret from the environment:

- ``SENTCL_GATE_USER`` / ``SENTCL_GATE_PASSWORD``: the account the pipeline, the flows and the worker use;
  MANAGE on the production model and on the experiments model, EDIT on the experiment;
- ``SENTCL_TEAM_USER`` / ``SENTCL_TEAM_PASSWORD`` (optional): a teammate's account; EDIT on the experiment
  (log runs), MANAGE on the experiments model (``registry.experiment_model_name``), READ on production.
"""

from __future__ import annotations

import os
import sys

from sentcl.registry import GateConfig
from sentcl_mlflow.store import EXPERIMENT, client, load_params_file, tracking_uri


def _auth_client():
    from mlflow.server import get_app_client

    return get_app_client("basic-auth", tracking_uri=tracking_uri())


def ensure_user(auth, username: str, password: str) -> None:  # noqa: ANN001
    from mlflow.exceptions import MlflowException

    try:
        auth.create_user(username, password)
    except MlflowException as e:
        if "RESOURCE_ALREADY_EXISTS" not in str(getattr(e, "error_code", "")) + str(e):
            raise
        auth.update_user_password(username, password)  # the environment is the source of truth


def grant(auth, username: str, resource_type: str, resource_id: str, permission: str) -> None:  # noqa: ANN001
    auth.grant_user_permission(username, resource_type, resource_id, permission)


def setup(config: GateConfig | None = None) -> dict[str, str]:
    """Create the gate's (and optionally a teammate's) account and their permissions. Run as the admin."""
    from mlflow.exceptions import MlflowException

    config = config or GateConfig.from_params(load_params_file())
    gate_user, gate_password = _required("SENTCL_GATE_USER"), _required("SENTCL_GATE_PASSWORD")
    mlc = client()
    auth = _auth_client()
    for name in (config.model_name, config.experiment_model_name):
        try:
            mlc.create_registered_model(name)  # owned by the admin, so nobody else gets MANAGE by creating it
        except MlflowException as e:
            if str(getattr(e, "error_code", "")) != "RESOURCE_ALREADY_EXISTS":
                raise
    from sentcl_mlflow.store import experiment_id

    exp_id = experiment_id(mlc)
    ensure_user(auth, gate_user, gate_password)
    grant(auth, gate_user, "registered_model", config.model_name, "MANAGE")
    grant(auth, gate_user, "registered_model", config.experiment_model_name, "MANAGE")
    grant(auth, gate_user, "experiment", exp_id, "EDIT")
    accounts = {"gate": gate_user}
    team_user, team_password = os.environ.get("SENTCL_TEAM_USER"), os.environ.get("SENTCL_TEAM_PASSWORD")
    if team_user and team_password:
        ensure_user(auth, team_user, team_password)
        grant(auth, team_user, "experiment", exp_id, "EDIT")
        grant(auth, team_user, "registered_model", config.experiment_model_name, "MANAGE")
        accounts["team"] = team_user
    print(
        f"auth: {gate_user} may edit {config.model_name!r} (champion); "
        + (
            f"{team_user} may log to {EXPERIMENT!r} and register into {config.experiment_model_name!r}; "
            if "team" in accounts
            else ""
        )
        + "everyone else reads"
    )
    return accounts


def _required(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise SystemExit(f"auth: {name} is not set (secrets come from the environment; see .env.example)")
    return value


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv != ["setup"]:
        print("usage: python -m sentcl_mlflow.auth setup", file=sys.stderr)
        return 2
    setup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
