"""Accounts and permissions of an MLflow server running the basic-auth app (``make serve``, compose).

    python -m sentcl_mlflow.auth bootstrap  # before the server starts: the users database and the admin
    python -m sentcl_mlflow.auth setup      # as the admin: MLFLOW_TRACKING_USERNAME/PASSWORD = the admin's

MLflow has no permission per alias, so the production registered model (``registry.model_name``) is
editable by the gate's account only: everyone else reads it (the server's ``default_permission = READ``)
and cannot move ``champion``. The promotion lease of each model (``<model>.promotion-lease``, see
``sentcl_mlflow.registry.lease.promotion_lock``) is a registered model the admin creates here, so only the accounts
granted on it can take it. ``setup`` is idempotent (run at every ``make serve`` and compose ``up``: what
exists is kept, a permission that differs is replaced) and reads every secret from the environment:

- ``SENTCL_GATE_USER`` / ``SENTCL_GATE_PASSWORD``: the gate's account (under ``make serve`` only the gate
  process, ``sentcl_mlflow.registry.gatekeeper``, holds it);
  MANAGE on the production model, the experiments model and both leases, EDIT on the experiment, MANAGE on
  the production experiment (``<experiment>-production``, where production registrations log their run);
- ``SENTCL_REGISTRAR_USER`` / ``SENTCL_REGISTRAR_PASSWORD`` (``make serve`` requires them): the account of
  the worker, its flow runs and their stages; EDIT on the experiment, MANAGE on the candidates model
  (``registry.candidate_model_name``) and its lease, READ on production, its lease and the production
  experiment. The gate's account gets EDIT on the candidates model (it writes its verdict there);
- ``SENTCL_TEAM_USER`` / ``SENTCL_TEAM_PASSWORD`` (optional): a teammate's account; EDIT on the experiment
  (log runs), MANAGE on the experiments model (``registry.experiment_model_name``) and its lease, READ on
  production, on its lease (so it can neither take nor hold the production lease) and on the production
  experiment (so it cannot overwrite a production run's artifacts).

``bootstrap`` creates the admin in the users database named by ``MLFLOW_AUTH_CONFIG_PATH`` before the
server starts, so the server process itself never holds the admin password (``infra/mlflow-server.sh``).
The server's ``authorization_function`` (the auth ini infra/mlflow-server.sh and the compose file write) is
:func:`authenticate_request`: MLflow's basic auth, then one rule for registered-model names on
every request that creates or names one (create, rename, a version, an alias), for every account, the admin
included: the name must be its own canonical form and read differently from every protected name
(``GateConfig``'s three models and their leases) and every existing model (``sentcl.registry.model_names``);
otherwise 400, one line of JSON naming the rule. So ``Sentcl-Encoder``, ``sentcl-encoder `` or
``sentcl‐encoder`` (U+2010) can never be made beside ``sentcl-encoder``, nor given a ``champion`` alias.
"""

from __future__ import annotations

import functools
import json
import os
import sys

from sentcl.registry.model_names import name_problem
from sentcl.registry.rules import GateConfig
from sentcl_mlflow.store import EXPERIMENT, client, tracking_uri

# A password must not be easy to guess (docs/registry-security.md, "Where the secrets come from"): make serve's
# infra/serve.sh applies the same rule to every secret it is given.
MIN_SECRET = 16


class WeakSecretError(ValueError):
    """A password that is shorter than MIN_SECRET characters, blank (spaces only) or one character repeated."""


def secret_problem(value: str) -> str | None:
    """Why ``value`` is too easy to guess to be a password, or None."""
    if len(value) < MIN_SECRET:
        return f"is shorter than {MIN_SECRET} characters"
    if not value.strip():
        return "is blank (spaces only)"
    if len(set(value)) == 1:
        return "is one character repeated"
    return None


def check_secret(name: str, value: str) -> str:
    """``value`` (the variable ``name``), or :class:`WeakSecretError` naming the variable, never the value."""
    problem = secret_problem(value)
    if problem:
        raise WeakSecretError(
            f"{name} {problem}: use a long random one (python3 -c 'import secrets; "
            "print(secrets.token_urlsafe(24))')"
        )
    return value


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
    """Idempotent: an existing grant that says the same is kept, one that differs is replaced."""
    from mlflow.exceptions import MlflowException

    try:
        auth.grant_user_permission(username, resource_type, resource_id, permission)
        return
    except MlflowException as e:
        if "RESOURCE_ALREADY_EXISTS" not in str(getattr(e, "error_code", "")) + str(e):
            raise
    current = auth.get_user_permission(username, resource_type, resource_id).permission
    if str(current).upper() == permission.upper():
        return
    auth.revoke_user_permission(username, resource_type, resource_id)
    auth.grant_user_permission(username, resource_type, resource_id, permission)


def bootstrap() -> None:
    """The users database and the admin account, before the server starts (the server then needs no admin
    password). Reads MLFLOW_AUTH_CONFIG_PATH, MLFLOW_AUTH_ADMIN_USERNAME and MLFLOW_AUTH_ADMIN_PASSWORD."""
    import configparser

    from mlflow.server.auth.sqlalchemy_store import SqlAlchemyStore

    config = configparser.ConfigParser()
    config_path = _required("MLFLOW_AUTH_CONFIG_PATH")
    config.read(config_path)
    username = os.environ.get("MLFLOW_AUTH_ADMIN_USERNAME") or "admin"
    users = SqlAlchemyStore()
    users.init_db(config["mlflow"]["database_uri"])
    if users.has_user(username):
        return
    password = check_secret("MLFLOW_AUTH_ADMIN_PASSWORD", _required("MLFLOW_AUTH_ADMIN_PASSWORD"))
    users.create_user(username, password, is_admin=True)
    print(f"auth: created the admin account {username!r}")


# The field that names the model in each request that creates one, renames one (its new name) or writes into
# one (a version, an alias): MLflow's request messages (mlflow.protos.model_registry_pb2).
NAME_FIELDS = {
    "CreateRegisteredModel": "name",
    "RenameRegisteredModel": "new_name",
    "CreateModelVersion": "name",
    "SetRegisteredModelAlias": "name",
}


def authenticate_request():  # noqa: ANN201 (werkzeug's Authorization, or a flask Response)
    """The MLflow server's ``authorization_function`` (see the module): MLflow's basic auth, and for a request
    that creates or names a registered model, the name rule. MLflow calls it several times a request; the rule
    is decided once (``flask.g``)."""
    from flask import g
    from mlflow.server.auth import authenticate_request_basic_auth
    from werkzeug.datastructures import Authorization

    authorization = authenticate_request_basic_auth()
    if not isinstance(authorization, Authorization):
        return authorization  # 401: who asks comes before what they ask
    if "sentcl_name_refusal" not in g:
        g.sentcl_name_refusal = name_guard()
    return authorization if g.sentcl_name_refusal is None else g.sentcl_name_refusal


def name_guard():  # noqa: ANN201 (a flask Response, or None)
    """None, or the 400 (one line of JSON) for a request whose registered-model name breaks the rule."""
    from flask import Response, request

    field = _name_routes().get((request.path, request.method))
    if field is None:
        return None
    payload = request.get_json(force=True, silent=True)  # as MLflow's handlers read it, content type or not
    if isinstance(payload, str):  # a double-encoded body, which MLflow decodes again
        try:
            payload = json.loads(payload)
        except ValueError:
            return None  # MLflow refuses it itself
    if not isinstance(payload, dict) or field not in payload:
        return None  # no name: MLflow refuses it itself
    try:
        problem = name_problem(payload[field], _known_names())
    except Exception as e:  # noqa: BLE001 (params.yaml or the store unreadable: refuse, never let it through)
        why = (str(e).splitlines() or [type(e).__name__])[0]
        body = {"error_code": "INTERNAL_ERROR", "message": f"the name rule could not be checked: {why}"}
        return Response(json.dumps(body), status=500, mimetype="application/json")
    if problem is None:
        return None
    body = {"error_code": "INVALID_PARAMETER_VALUE", "message": f"{field}: {problem}"}
    return Response(json.dumps(body), status=400, mimetype="application/json")


_routes: dict[tuple[str, str], str] | None = None


def _name_routes() -> dict[tuple[str, str], str]:
    """(path, method) -> the name field, for every route of NAME_FIELDS' requests (``/api/2.0``,
    ``/ajax-api/2.0``, a static prefix), as the server itself lists them."""
    global _routes
    if _routes is None:
        from mlflow.server.handlers import get_endpoints

        _routes = {
            (path, method): NAME_FIELDS[message.__name__]
            for path, message, methods in get_endpoints(lambda message: message)
            if getattr(message, "__name__", None) in NAME_FIELDS
            for method in methods
        }
    return _routes


@functools.cache
def _protected_names() -> tuple[str, ...]:
    """params.yaml ``registry:``'s three models and their promotion leases: read once per server process."""
    from sentcl.params import read_params
    from sentcl_mlflow.registry.lease import LEASE_SUFFIX

    config = GateConfig.from_params(read_params())
    models = (config.model_name, config.experiment_model_name, config.candidate_model_name)
    return (*models, *(name + LEASE_SUFFIX for name in models))


def _known_names() -> list[str]:
    """The protected names (params.yaml ``registry:``'s models and their promotion leases), then every
    registered model the server's store holds."""
    from mlflow.server.handlers import _get_model_registry_store  # the store MLflow's own handlers use

    names, registry, token = list(_protected_names()), _get_model_registry_store(), None
    while True:
        page = registry.search_registered_models(max_results=1000, page_token=token)
        names += [model.name for model in page]
        token = page.token
        if not token:
            return names


def setup(config: GateConfig) -> dict[str, str]:
    """Create the gate's (and optionally a teammate's) account and their permissions on the models ``config``
    names. Run as the admin, with requests bounded by the entry point (``store.bound_requests``)."""
    from mlflow.exceptions import MlflowException

    gate_user, gate_password = _required("SENTCL_GATE_USER"), _required("SENTCL_GATE_PASSWORD")
    check_secret("SENTCL_GATE_PASSWORD", gate_password)  # every account's password, before anything is made
    for key in ("SENTCL_REGISTRAR_PASSWORD", "SENTCL_TEAM_PASSWORD"):
        if os.environ.get(key):
            check_secret(key, os.environ[key])
    mlc = client()
    auth = _auth_client()
    from sentcl_mlflow.registry.lease import LEASE_SUFFIX

    prod_lease = config.model_name + LEASE_SUFFIX
    exp_lease = config.experiment_model_name + LEASE_SUFFIX
    cand, cand_lease = config.candidate_model_name, config.candidate_model_name + LEASE_SUFFIX
    for lease in (prod_lease, exp_lease, cand_lease):
        _recreate_if_idle(mlc, lease)
    for name in (config.model_name, config.experiment_model_name, prod_lease, exp_lease, cand, cand_lease):
        try:
            mlc.create_registered_model(name)  # owned by the admin, so nobody else gets MANAGE by creating it
        except MlflowException as e:
            if str(getattr(e, "error_code", "")) != "RESOURCE_ALREADY_EXISTS":
                raise
    from sentcl_mlflow.registry.names import production_experiment
    from sentcl_mlflow.store import experiment_id

    exp_id = experiment_id(mlc)
    # Created here as the admin (its creator would get MANAGE on it): production runs are logged there, and
    # only the gate may write them, so no teammate can overwrite a production run's artifacts.
    prod_exp_id = experiment_id(mlc, production_experiment())
    ensure_user(auth, gate_user, gate_password)
    grant(auth, gate_user, "experiment", prod_exp_id, "MANAGE")
    grant(auth, gate_user, "registered_model", config.model_name, "MANAGE")
    grant(auth, gate_user, "registered_model", config.experiment_model_name, "MANAGE")
    grant(auth, gate_user, "registered_model", prod_lease, "MANAGE")
    grant(auth, gate_user, "registered_model", exp_lease, "MANAGE")
    grant(auth, gate_user, "experiment", exp_id, "EDIT")
    # It copies candidates into production (READ would do) and writes its verdict on them (EDIT: tags).
    grant(auth, gate_user, "registered_model", cand, "EDIT")
    accounts = {"gate": gate_user}
    registrar, registrar_password = (
        os.environ.get("SENTCL_REGISTRAR_USER"),
        os.environ.get("SENTCL_REGISTRAR_PASSWORD"),
    )
    if registrar and registrar_password:
        # make serve's worker and flows: log runs, register candidates, read production; never edit it (in
        # MLflow registering a version and setting an alias are one permission, so production is READ).
        ensure_user(auth, registrar, registrar_password)
        grant(auth, registrar, "experiment", exp_id, "EDIT")
        grant(auth, registrar, "experiment", prod_exp_id, "READ")
        grant(auth, registrar, "registered_model", cand, "MANAGE")
        grant(auth, registrar, "registered_model", cand_lease, "MANAGE")
        grant(auth, registrar, "registered_model", config.model_name, "READ")
        grant(auth, registrar, "registered_model", prod_lease, "READ")
        accounts["registrar"] = registrar
    team_user, team_password = os.environ.get("SENTCL_TEAM_USER"), os.environ.get("SENTCL_TEAM_PASSWORD")
    if team_user and team_password:
        ensure_user(auth, team_user, team_password)
        grant(auth, team_user, "experiment", exp_id, "EDIT")
        grant(auth, team_user, "experiment", prod_exp_id, "READ")  # reads production runs, never writes them
        grant(auth, team_user, "registered_model", config.experiment_model_name, "MANAGE")
        grant(auth, team_user, "registered_model", exp_lease, "MANAGE")
        # Explicitly READ (replacing any MANAGE its creator got) on the production model's lease.
        grant(auth, team_user, "registered_model", prod_lease, "READ")
        grant(auth, team_user, "registered_model", cand, "READ")
        grant(auth, team_user, "registered_model", cand_lease, "READ")
        accounts["team"] = team_user
    print(
        f"auth: {gate_user} may edit {config.model_name!r} (champion); "
        + (f"{registrar} may register into {cand!r}; " if "registrar" in accounts else "")
        + (
            f"{team_user} may log to {EXPERIMENT!r} and register into {config.experiment_model_name!r}; "
            if "team" in accounts
            else ""
        )
        + "everyone else reads"
    )
    return accounts


def _recreate_if_idle(mlc, lease: str) -> None:  # noqa: ANN001
    """A lease model nobody holds or waits on (no versions) is deleted and created again below as the
    admin, which drops whatever permissions its creator got: one a teammate made before setup (or under an
    older version of this code) is theirs no more. A lease in use is left alone."""
    from mlflow.exceptions import MlflowException

    try:
        if list(mlc.search_model_versions(f"name='{lease}'")):
            return
        mlc.delete_registered_model(lease)
    except MlflowException as e:
        if str(getattr(e, "error_code", "")) != "RESOURCE_DOES_NOT_EXIST":
            raise


def _required(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise SystemExit(f"auth: {name} is not set (secrets come from the environment; see .env.example)")
    return value


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["bootstrap"]:
        try:
            bootstrap()
        except WeakSecretError as e:
            print(f"auth: {e}", file=sys.stderr)
            return 2
        return 0
    if argv not in (["setup"], ["setup", "--env-stdin"]):
        print("usage: python -m sentcl_mlflow.auth setup [--env-stdin]|bootstrap", file=sys.stderr)
        return 2
    if "--env-stdin" in argv:
        # KEY=VALUE lines (make serve): the passwords never appear in this process's /proc/<pid>/environ,
        # which the worker's flow runs (same OS user) could read while a second `make serve` runs setup.
        from sentcl.registry.host import close_process

        close_process()
        for line in sys.stdin.read().splitlines():
            key, sep, value = line.partition("=")
            if sep and key:
                os.environ[key] = value
    from mlflow.exceptions import MlflowException

    from sentcl.params import ParamsError, read_params
    from sentcl_mlflow.store import (
        TrackingAuthError,
        TrackingConfig,
        TrackingUnavailableError,
        bound_requests,
    )

    try:
        params = read_params()  # this process's one read: the checkout's params.yaml
        config = GateConfig.from_params(params)
        bound_requests(TrackingConfig.from_params(params))
    except ParamsError as e:
        print(f"auth: {e}", file=sys.stderr)
        return 2
    try:
        setup(config)
    except WeakSecretError as e:
        print(f"auth: {e}", file=sys.stderr)
        return 2
    except (TrackingAuthError, MlflowException) as e:
        print(f"auth: {getattr(e, 'message', e)}".splitlines()[0], file=sys.stderr)
        return 2
    except TrackingUnavailableError as e:
        print(f"auth: {e}", file=sys.stderr)
        return 75
    return 0


if __name__ == "__main__":
    sys.exit(main())
