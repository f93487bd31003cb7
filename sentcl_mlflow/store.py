"""Where runs go, and the one MLflow client every stage and flow uses (with credentials, bounded waits).

Part of ``sentcl_mlflow``, the layer that talks to MLflow; sentcl never imports it. MLflow is imported lazily
so that a stage that only reads the helpers (``tracking_uri``) does not pay for it.

Where runs go: ``MLFLOW_TRACKING_URI`` when set, else ``sqlite:///<repo root>/mlflow.db`` with artifacts in
``<repo root>/mlartifacts``. The root comes from DVC (``DVC_ROOT`` names the parent repository for queued and
``--temp`` experiments) or git, so every copy of the workspace writes to the one store. A server started with
MLflow's basic-auth app wants ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` (read by MLflow
itself from the environment; never from a file here).
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sentcl.params import ROOT, read_section, whole_number

if TYPE_CHECKING:
    from mlflow import MlflowClient

# One run per stage: a Hugging Face Trainer, if a stage ever uses one, would otherwise open a second run.
os.environ.setdefault("DISABLE_MLFLOW_INTEGRATION", "TRUE")

EXPERIMENT = os.environ.get("SENTCL_MLFLOW_EXPERIMENT", "sentcl")
# A reachability probe of a tracking server: attempts x timeout bounds how long a stage waits for it.
CONNECT_ATTEMPTS = int(os.environ.get("SENTCL_MLFLOW_CONNECT_ATTEMPTS", "3"))
CONNECT_TIMEOUT_S = float(os.environ.get("SENTCL_MLFLOW_CONNECT_TIMEOUT_S", "3"))


class TrackingUnavailableError(RuntimeError):
    """The tracking server did not answer after bounded retries; nothing was logged or registered.
    Transient: a stage exits with ``sentcl_mlflow.exit_codes.EXIT_TRANSIENT`` for it, and a flow may retry."""


class TrackingAuthError(RuntimeError):
    """The tracking server refused the credentials (or none were given). Not transient."""


# MLflow reads these at every request; ours are set (unless the user set them) where a process first asks
# for a client, so every later request of the process is bounded the same way.
HTTP_ENV = {
    "request_timeout_s": "MLFLOW_HTTP_REQUEST_TIMEOUT",
    "request_retries": "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
    "request_backoff_s": "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
}


@dataclass(frozen=True)
class TrackingConfig:
    """params.yaml ``tracking:``: how long one MLflow request may take and how often it is tried again."""

    request_timeout_s: int
    request_retries: int
    request_backoff_s: int

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> TrackingConfig:
        names = [f.name for f in fields(cls)]
        raw = read_section(params, "tracking", names, optional=names)
        for name in names:
            # MLflow parses these variables as integers; a request without a timeout would be unbounded.
            whole_number(raw.get(name), f"tracking.{name}", minimum=1 if name == "request_timeout_s" else 0)
        return cls(**raw)

    def worst_case_s(self) -> float:
        """How long one request to a server that accepts and never answers takes to fail, about."""
        backoff = sum(self.request_backoff_s * 2**i for i in range(self.request_retries))
        return self.request_timeout_s * (self.request_retries + 1) + backoff


def bound_requests(config: TrackingConfig) -> None:
    """Set MLflow's request timeout and retries from params.yaml ``tracking:``, leaving a value the user exported
    alone. MLflow's own defaults wait minutes (7 retries, factor 2, 120 s timeout); these keep a dead or hung
    server from stalling a process, while still riding out a short blip. MLflow reads them from the environment
    at every request, so a process's entry point calls this once, with the config it parsed from its params,
    before its first request (``client`` does not read params)."""
    for name, variable in HTTP_ENV.items():
        os.environ.setdefault(variable, str(getattr(config, name)))


def answers(uri: str | None = None, timeout_s: float | None = None) -> bool:
    """One short /health request: whether cleanup writes (a run's FAILED status, a lease release) after a
    connection failure are worth trying, or would only wait out the request timeout again."""
    uri = uri or tracking_uri()
    if not uri.startswith(("http://", "https://")):
        return True
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s or CONNECT_TIMEOUT_S):
            return True
    except urllib.error.HTTPError as e:
        return e.code < 500
    except (OSError, urllib.error.URLError):
        return False


@contextmanager
def quick_requests() -> Iterator[None]:
    """MLflow requests with one short try each, for best-effort cleanup after the server stopped answering:
    a dead server refuses at once, a hung one costs CONNECT_TIMEOUT_S instead of the full bounded retries."""
    saved = {v: os.environ.get(v) for v in HTTP_ENV.values()}
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(max(1, int(CONNECT_TIMEOUT_S)))
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
    try:
        yield
    finally:
        for variable, value in saved.items():
            if value is None:
                os.environ.pop(variable, None)
            else:
                os.environ[variable] = value


# --------------------------------------------------------------------------------------------- where


def _git(*args: str, cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out or None


def _outside_dvc_tmp(path: Path) -> Path:
    """A DVC temp/queued experiment runs in ``<repo>/.dvc/tmp/exps/<tmpdir>``, a git repo of its own."""
    parts = path.parts
    for i in range(len(parts) - 3):
        if parts[i : i + 3] == (".dvc", "tmp", "exps"):
            return Path(*parts[:i])
    return path


def repo_root(start: Path | None = None) -> Path:
    """The repository whose ``mlflow.db`` this process should write to."""
    if os.environ.get("DVC_ROOT"):
        return _outside_dvc_tmp(Path(os.environ["DVC_ROOT"]).resolve())
    start = start or Path.cwd()
    # --git-common-dir, not --show-toplevel: a linked worktree shares the main checkout's store.
    common = _git("rev-parse", "--path-format=absolute", "--git-common-dir", cwd=start)
    if common:
        return _outside_dvc_tmp(Path(common).parent.resolve())
    return _outside_dvc_tmp(ROOT)


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{repo_root() / 'mlflow.db'}"


def tracking_enabled() -> bool:
    """``SENTCL_MLFLOW=0`` switches tracking off, for unit tests of stages that do not test tracking."""
    return os.environ.get("SENTCL_MLFLOW", "1").lower() not in ("0", "false", "off", "no")


def _probe_http(uri: str) -> None:
    """The server answers (bounded retries), and accepts this process's credentials."""
    url = uri.rstrip("/") + "/health"
    last: Exception | None = None
    for attempt in range(CONNECT_ATTEMPTS):
        try:
            with urllib.request.urlopen(url, timeout=CONNECT_TIMEOUT_S) as response:
                if response.status < 500:
                    return
        except urllib.error.HTTPError as e:  # a server that answers at all, even 404 behind a proxy, is up
            if e.code < 500:
                return
            last = e
        except (OSError, urllib.error.URLError) as e:
            last = e
        if attempt + 1 < CONNECT_ATTEMPTS:
            time.sleep(min(2**attempt, 4))
    raise TrackingUnavailableError(
        f"MLflow tracking server {uri} is unreachable after {CONNECT_ATTEMPTS} attempts "
        f"({CONNECT_TIMEOUT_S:g}s timeout each): {last}. Start it, fix MLFLOW_TRACKING_URI, or unset it to "
        f"use the local store sqlite:///<repo>/mlflow.db. Nothing was logged or registered."
    )


def _check_credentials(uri: str) -> None:
    """One authenticated read: a basic-auth server answers 401 without (or with wrong) credentials."""
    import base64

    request = urllib.request.Request(
        uri.rstrip("/") + "/api/2.0/mlflow/experiments/get-by-name?experiment_name=" + EXPERIMENT
    )
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if user and password:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=CONNECT_TIMEOUT_S * 3):
            return
    except urllib.error.HTTPError as e:
        if e.code == 401:
            who = f"user {user!r}" if user else "no MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD set"
            raise TrackingAuthError(
                f"MLflow tracking server {uri} refused the credentials ({who}): set "
                "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD in the environment"
            ) from None
    except (OSError, urllib.error.URLError):
        return  # reachability was checked just before; a blip here shows up on the real call


_configured: str | None = None


def client() -> MlflowClient:
    """An MlflowClient on the resolved store, after a bounded reachability check of a remote server."""
    global _configured
    uri = tracking_uri()
    if _configured != uri:
        # Requests are bounded by the process's entry point (bound_requests), before it asks for a client.
        if uri.startswith(("http://", "https://")):
            _probe_http(uri)
            _check_credentials(uri)
        elif uri.startswith("sqlite:///"):
            Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        import mlflow

        mlflow.set_tracking_uri(uri)
        mlflow.set_registry_uri(uri)
        _configured = uri
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


UNAUTHENTICATED = "unauthenticated:"  # the prefix of an identity no server vouched for


def caller_identity() -> str:
    """Who the registry says is calling: the account MLflow's auth app authenticated this process as (its
    ``/api/2.0/mlflow/users/current``, answered only for valid credentials). A store without accounts (the
    local sqlite store, a server without the auth app) vouches for nobody: ``unauthenticated:<login>``.
    What a promotion or rollback records as *who*; ``--by`` is only a note beside it."""
    import base64
    import getpass
    import json

    uri = tracking_uri()
    local = f"{UNAUTHENTICATED}{getpass.getuser()}"
    if not uri.startswith(("http://", "https://")):
        return local
    request = urllib.request.Request(uri.rstrip("/") + "/api/2.0/mlflow/users/current")
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if user and password:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=CONNECT_TIMEOUT_S * 3) as response:
            return str(json.loads(response.read())["user"]["username"])
    except urllib.error.HTTPError as e:
        if e.code == 404:  # no auth app: anyone may call it anything
            return local
        if e.code in (401, 403):
            raise TrackingAuthError(
                f"MLflow tracking server {uri} did not authenticate {user or 'this process'} (HTTP {e.code}): set "
                "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD in the environment"
            ) from None
        raise TrackingUnavailableError(
            f"MLflow tracking server {uri} answered HTTP {e.code} for who is calling"
        ) from None
    except (OSError, urllib.error.URLError, ValueError, KeyError) as e:
        raise TrackingUnavailableError(
            f"MLflow tracking server {uri} did not say who is calling ({type(e).__name__}: {e})"
        ) from None


def preflight() -> None:
    """Call at the start of a long stage: an unreachable tracking server then fails it before the work, not
    after it (``log_stage`` at the end would raise the same error)."""
    if tracking_enabled():
        client()


def experiment_id(mlc: MlflowClient, name: str = EXPERIMENT) -> str:
    exp = mlc.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = None
    uri = tracking_uri()
    if uri.startswith("sqlite:///"):
        # Beside the database, not in ./mlruns of whatever folder the stage happened to run in.
        location = (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()
    try:
        return mlc.create_experiment(name, artifact_location=location)
    except Exception:  # another stage created it meanwhile
        exp = mlc.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def git_commit() -> str | None:
    return _git("rev-parse", "HEAD", cwd=repo_root())


def git_dirty() -> bool:
    status = _git("status", "--porcelain", "--untracked-files=no", cwd=repo_root())
    return bool(status)
