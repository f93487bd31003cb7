"""Where the MLflow tracking server keeps its runs, registry, users and artifacts: the one switch, checked.

``infra/mlflow-server.sh PORT [BACKEND_STORE_URI ARTIFACTS_DESTINATION]`` asks this module (``python -m
sentcl_mlflow.server_store``) before it starts anything. Its two arguments win (what `make serve` passes: the
sqlite store and the folder beside it); without them the environment decides, with MLflow's own names:

- ``MLFLOW_BACKEND_STORE_URI`` / ``MLFLOW_ARTIFACTS_DESTINATION``: unset, the embedded default,
  ``sqlite:///<repo>/mlflow.db`` and ``<repo>/mlartifacts`` (one machine);
- a team's store is both halves at once: a ``postgresql://`` backend and an ``s3://`` destination, with
  ``MLFLOW_S3_ENDPOINT_URL`` (an S3 server other than AWS's) and the server's key (``AWS_ACCESS_KEY_ID`` and
  ``AWS_SECRET_ACCESS_KEY``, or ``AWS_SHARED_CREDENTIALS_FILE``); ``infra/team/team-up`` writes such a set;
- ``SENTCL_MLFLOW_USERS_DB``: the basic-auth app's users database (default ``sqlite:///<run dir>/mlflow-users.db``).

A half-set team configuration (PostgreSQL with a local artifact folder, S3 with the sqlite file, an endpoint
without a key, half a key pair) is refused in one line, exit 2, before anything starts; so is a password inside a
database URI, which would sit in the server's argv for ``ps`` to show (libpq reads it from ``PGPASSFILE``).
:func:`resolve` is pure (a mapping in, a value or ``StoreConfigError`` out); :func:`main` is the entry point.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from sentcl_mlflow.exit_codes import EXIT_BAD_INPUT

POSTGRES = ("postgresql://", "postgresql+psycopg2://", "postgres://")


class StoreConfigError(ValueError):
    """The server's store settings do not make one whole configuration; the message says what to set."""


@dataclass(frozen=True)
class ServerStore:
    backend: str  # --backend-store-uri
    artifacts: str  # --artifacts-destination (served by the server: clients hold no storage key)
    users_db: str  # the basic-auth app's database_uri
    team: bool  # PostgreSQL + S3 (else the embedded sqlite store and a local folder)


def _no_password(uri: str, what: str) -> None:
    if uri.startswith(POSTGRES) and urlsplit(uri).password is not None:
        raise StoreConfigError(
            f"{what} carries a password, which the server's command line would show to ps: drop it from the "
            "URI and give it in a PGPASSFILE (infra/team/team-up writes one)"
        )


def resolve(
    env: Mapping[str, str],
    root: Path,
    run_dir: Path,
    backend: str | None = None,
    artifacts: str | None = None,
) -> ServerStore:
    """The server's stores from its arguments (both or neither) else ``env``; ``StoreConfigError`` if half-set."""
    if (backend is None) != (artifacts is None):
        raise StoreConfigError("give both BACKEND_STORE_URI and ARTIFACTS_DESTINATION, or neither")
    if backend is None:
        backend = env.get("MLFLOW_BACKEND_STORE_URI") or ""
        artifacts = env.get("MLFLOW_ARTIFACTS_DESTINATION") or ""
    assert artifacts is not None
    if not backend and artifacts:
        raise StoreConfigError(
            "MLFLOW_ARTIFACTS_DESTINATION is set but MLFLOW_BACKEND_STORE_URI is not: set both (a team's "
            "postgresql:// store and s3:// artifacts) or neither (the embedded sqlite store)"
        )
    if backend and not artifacts:
        raise StoreConfigError(
            "MLFLOW_BACKEND_STORE_URI is set but MLFLOW_ARTIFACTS_DESTINATION is not: set both or neither"
        )
    backend = backend or f"sqlite:///{root / 'mlflow.db'}"
    artifacts = artifacts or str(root / "mlartifacts")
    users_db = env.get("SENTCL_MLFLOW_USERS_DB") or f"sqlite:///{run_dir / 'mlflow-users.db'}"
    _no_password(backend, "MLFLOW_BACKEND_STORE_URI")
    _no_password(users_db, "SENTCL_MLFLOW_USERS_DB")
    shared_db, s3 = backend.startswith(POSTGRES), artifacts.startswith("s3://")
    if shared_db and not s3:
        raise StoreConfigError(
            f"a PostgreSQL backend with artifacts in {artifacts}: a team's server needs an s3:// "
            "MLFLOW_ARTIFACTS_DESTINATION (a local folder is one machine's)"
        )
    if s3 and not shared_db:
        raise StoreConfigError(
            f"s3:// artifacts with the backend {backend.split('://')[0]}: a team's server needs a postgresql:// "
            "MLFLOW_BACKEND_STORE_URI too"
        )
    if not (shared_db or backend.startswith("sqlite:///")):
        raise StoreConfigError(
            f"unsupported backend store {backend.split('://')[0]}:// (sqlite or postgresql)"
        )
    if s3:
        key_id, secret = bool(env.get("AWS_ACCESS_KEY_ID")), bool(env.get("AWS_SECRET_ACCESS_KEY"))
        if key_id != secret:
            raise StoreConfigError("half an S3 key: set both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
        endpoint = env.get("MLFLOW_S3_ENDPOINT_URL", "")
        if endpoint and not endpoint.startswith(("http://", "https://")):
            raise StoreConfigError(f"MLFLOW_S3_ENDPOINT_URL {endpoint!r} is not an http(s) URL")
        if endpoint and not (key_id or env.get("AWS_SHARED_CREDENTIALS_FILE")):
            raise StoreConfigError(
                f"MLFLOW_S3_ENDPOINT_URL={endpoint} without a key: set AWS_SHARED_CREDENTIALS_FILE (or "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY) to the server's S3 identity"
            )
    elif env.get("MLFLOW_S3_ENDPOINT_URL"):
        raise StoreConfigError(
            f"MLFLOW_S3_ENDPOINT_URL is set but the artifacts go to {artifacts}: set an s3:// "
            "MLFLOW_ARTIFACTS_DESTINATION (and a postgresql:// backend), or unset the endpoint"
        )
    return ServerStore(backend, artifacts, users_db, shared_db)


def main(argv: list[str] | None = None) -> int:
    """Print the backend, the artifacts destination and the users database, one a line; or one line, exit 2."""
    import os

    parser = argparse.ArgumentParser(prog="python -m sentcl_mlflow.server_store", description=__doc__)
    parser.add_argument("--root", type=Path, required=True, help="the checkout (the default sqlite store)")
    parser.add_argument("--run-dir", type=Path, required=True, help="where the default users database lives")
    parser.add_argument("stores", nargs="*", metavar="URI", help="BACKEND_STORE_URI ARTIFACTS_DESTINATION")
    args = parser.parse_args(argv)
    if len(args.stores) not in (0, 2):
        print(
            "mlflow-server: give both BACKEND_STORE_URI and ARTIFACTS_DESTINATION, or neither",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    try:
        found = resolve(os.environ, args.root, args.run_dir, *args.stores)
    except StoreConfigError as e:
        print(f"mlflow-server: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(found.backend, found.artifacts, found.users_db, sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
