"""Where a run's artifacts go: one folder, ``mlartifacts`` beside the sqlite store, reached two ways.

Without a server (`make run`) a process writes that folder itself. Under `make serve` the MLflow server serves it
(``--artifacts-destination``, ``--serve-artifacts``) and every process writes through the server, whose auth app
checks the account on each upload: the worker's sandbox cannot write the folder (it holds the production
versions' files), so an experiment whose artifact root is a ``file:`` path there is one its flow runs cannot log
to ("Read-only file system"). The experiments `make run` creates are such ones. Two pieces make the one folder
serve both:

- :func:`proxy_experiments`, which `make serve` runs before it starts the server (``python -m
  sentcl_mlflow.artifact_roots``): each experiment whose root is that folder, or a folder in it, gets the root
  ``mlflow-artifacts:/<experiment id>``, where the server itself puts the experiments it creates, and each run,
  logged model and model version stored in the folder its ``mlflow-artifacts:/`` address there. No file moves:
  they are read and written through the server from then on (as root, `make serve`'s worker runs as an account of
  its own, which cannot read the files `make run` wrote as root, safetensors' 0600 weights among them). An
  experiment of this project whose root is a ``file:`` path elsewhere is refused in one line (exit 2) saying what
  to do. Over the server, what `make run` logged (its paths name no experiment) is readable by every account and
  writable by none but the admin, as MLflow's auth app judges such a path by ``default_permission`` (READ).
- :func:`artifact_repository`, this package's MLflow artifact repository for ``mlflow-artifacts:`` (pyproject.toml,
  entry point group ``mlflow.artifact_repository``): a process tracking to the sqlite store directly (a later
  `make run`, a stage started by hand) has no server to proxy for it, so it reads and writes the same path in the
  folder beside the store; with a tracking server it is MLflow's own repository, unchanged.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

from sentcl_mlflow.exit_codes import EXIT_BAD_INPUT

FOLDER = "mlartifacts"  # beside mlflow.db: store.experiment_id (without a server) and make serve's server
PROXIED = "mlflow-artifacts"


def sqlite_path(store_uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` store URI; None for any other store."""
    if not store_uri.startswith("sqlite:///"):
        return None
    return Path(store_uri.removeprefix("sqlite:///").split("?", 1)[0])


def local_folder(store_uri: str) -> Path | None:
    """The artifacts folder beside a sqlite store (what a server over it serves); None for any other store."""
    database = sqlite_path(store_uri)
    return None if database is None else database.parent / FOLDER


def artifact_repository(artifact_uri: str, tracking_uri: str | None = None, registry_uri: str | None = None):  # noqa: ANN201
    """The repository of an ``mlflow-artifacts:`` URI: MLflow's (through the tracking server) unless this process
    tracks to a sqlite store directly, when it is that path in the folder beside the store."""
    import mlflow
    from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository
    from mlflow.store.artifact.mlflow_artifacts_repo import MlflowArtifactsRepository

    folder = local_folder(tracking_uri or mlflow.get_tracking_uri())
    parsed = urlparse(artifact_uri)
    if folder is None or parsed.netloc:  # a server's, or one naming its server: MLflow's own
        return MlflowArtifactsRepository(artifact_uri, tracking_uri=tracking_uri, registry_uri=registry_uri)
    from mlflow.utils.uri import validate_path_is_safe

    path = unquote(parsed.path).strip("/")
    local = folder / validate_path_is_safe(path) if path else folder  # no "..": never outside the folder
    return LocalArtifactRepository(local.as_uri(), tracking_uri=tracking_uri, registry_uri=registry_uri)


def _file_path(location: str) -> Path | None:
    """The folder of a ``file:`` URI or a plain path; None for any other scheme."""
    parsed = urlparse(location)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "" and location.startswith("/"):
        return Path(location)
    return None


def _within(path: Path, folder: Path) -> bool:
    path, folder = path.resolve(), folder.resolve()
    return path == folder or folder in path.parents


# The stored locations that name files: an experiment's root, a run's, a logged model's and a model version's.
LOCATIONS = (
    ("runs", "run_uuid", "artifact_uri"),
    ("logged_models", "model_id", "artifact_location"),
    ("model_versions", "rowid", "storage_location"),
    ("model_versions", "rowid", "source"),
)


def _proxied(location: str | None, folder: Path) -> str | None:
    """``mlflow-artifacts:/<path in folder>`` for a ``file:`` location in ``folder``; None for any other."""
    path = _file_path(location or "")
    if path is None or not _within(path, folder):
        return None
    relative = path.resolve().relative_to(folder.resolve()).as_posix()
    return f"{PROXIED}:/" if relative == "." else f"{PROXIED}:/{relative}"


def proxy_experiments(store_uri: str, ours: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """Hand the folder beside a sqlite store to a server that serves it: every experiment whose root is in it gets
    the root the server gives the experiments it creates, ``mlflow-artifacts:/<id>``, and every run, logged model
    and model version stored there its ``mlflow-artifacts:/`` address (the same files, now read through the
    server: under `make serve` the worker's account may not be the one that wrote them). Returns (experiment,
    old root, new root) for each experiment changed. An experiment named in ``ours`` whose root is a ``file:``
    path outside the folder raises ValueError, and nothing is changed."""
    database, folder = sqlite_path(store_uri), local_folder(store_uri)
    if database is None or folder is None:
        raise ValueError(f"{store_uri} is not a sqlite store")
    if not database.exists():
        return []  # a first make serve: the server creates the experiments, with its own roots
    with sqlite3.connect(database, timeout=30) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "experiments" not in tables:
            return []
        changed = []
        for experiment_id, name, location in db.execute(
            "SELECT experiment_id, name, artifact_location FROM experiments"
        ).fetchall():
            if _proxied(location, folder) is not None:
                changed.append((experiment_id, name, location, f"{PROXIED}:/{experiment_id}"))
            elif name in ours and _file_path(location or "") is not None:
                raise ValueError(
                    f"experiment {name!r} keeps its artifacts in {location}, outside {folder}, which the "
                    "MLflow server serves: the worker's flow runs could not log to it. Point "
                    "SENTCL_MLFLOW_EXPERIMENT at a new experiment name, or move its files into "
                    f"{folder} and set its artifact_location to {PROXIED}:/{experiment_id}"
                )
        db.executemany(
            "UPDATE experiments SET artifact_location = ? WHERE experiment_id = ?",
            [(new, experiment_id) for experiment_id, _, _, new in changed],
        )
        for table, key, column in LOCATIONS:
            if table not in tables:
                continue
            rows = db.execute(
                f"SELECT {key}, {column} FROM {table} WHERE {column} LIKE 'file:%' OR {column} LIKE '/%'"
            )
            updates = [(new, row_key) for row_key, old in rows.fetchall() if (new := _proxied(old, folder))]
            db.executemany(f"UPDATE {table} SET {column} = ? WHERE {key} = ?", updates)
    return [(name, old, new) for _, name, old, new in changed]


def main(argv: list[str] | None = None) -> int:
    from sentcl_mlflow.registry.names import production_experiment
    from sentcl_mlflow.store import EXPERIMENT

    parser = argparse.ArgumentParser(
        prog="python -m sentcl_mlflow.artifact_roots",
        description="Before an MLflow server with --serve-artifacts starts over a sqlite store: the experiments "
        "whose artifacts are in the folder beside it log through the server from now on.",
    )
    parser.add_argument("--store", required=True, help="the server's backend store, sqlite:///PATH")
    args = parser.parse_args(argv)
    try:
        changed = proxy_experiments(args.store, (EXPERIMENT, production_experiment()))
    except (ValueError, sqlite3.Error) as e:
        print(f"serve: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for name, old, new in changed:
        print(
            f"serve: experiment {name!r} now logs through the MLflow server ({new}, was {old}); runs logged "
            "before keep their files"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
