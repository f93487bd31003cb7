"""What the flows share: running a stage as a bounded subprocess, typed transient retries, the promotion limit."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sentcl.params import FlowConfig
from sentcl_mlflow.exit_codes import EXIT_TRANSIENT
from stages.common import ROOT

PROMOTION_LIMIT = "sentcl-promotion"
PROGRESS_EVERY_S = 30  # at most one redraw of a progress bar per this many seconds in a flow's log
# dvc.stage.exceptions.StageCmdFailedError's message, as `dvc repro` prints it on its last line.
DVC_STAGE_EXIT = re.compile(r"^ERROR: failed to reproduce .*: failed to run: .*, exited with (-?\d+)$", re.M)


def bounded(flow: Any, config: FlowConfig, timeout_s: float | None = None) -> Any:
    """``flow`` (a Prefect flow) bounded as the run's params say: ``timeout_s``, default params.yaml
    ``flows.flow_timeout_s`` (0 = none). Applied where the run starts, after its params were read, never at
    import: a ``--set flows.flow_timeout_s=N`` reaches it."""
    seconds = config.flow_timeout_s if timeout_s is None else timeout_s
    return flow.with_options(timeout_seconds=seconds or None)


def retried(task: Any, config: FlowConfig) -> Any:
    """A :func:`stage_task` with this run's ``flows.retries`` and ``flows.retry_delay_s`` (applied in the flow
    run, from the params it read; the decorator alone retries nothing)."""
    return task.with_options(retries=config.retries, retry_delay_seconds=config.retry_delay_s)


class StageFailed(RuntimeError):
    def __init__(self, cmd: Sequence[str], returncode: int, output: str, timed_out: bool = False) -> None:
        self.cmd, self.returncode, self.output, self.timed_out = list(cmd), returncode, output, timed_out
        tail = "\n".join(output.strip().splitlines()[-25:])
        what = "timed out" if timed_out else f"exited {returncode}"
        super().__init__(f"{' '.join(cmd)} {what}:\n{tail}")

    @property
    def stage_returncode(self) -> int:
        """The stage's own exit code. `dvc repro` exits 255 whatever its stage returned, and reports the
        stage's code in the message of its StageCmdFailedError ("failed to run: CMD, exited with N"):
        that structured report is read here, the stage's own output never is."""
        if self.returncode == 255 and "dvc" in self.cmd and "repro" in self.cmd:
            codes = DVC_STAGE_EXIT.findall(self.output)
            if codes:
                return int(codes[-1])
        return self.returncode

    @property
    def transient(self) -> bool:
        """Only the exit code a stage returns for "try again" (a server or lock that did not answer)."""
        return not self.timed_out and self.stage_returncode == EXIT_TRANSIENT


def run_stage(
    cmd: Sequence[str], env: dict[str, str] | None = None, cwd: Path = ROOT, *, timeout_s: float
) -> str:
    """Run a stage command, stream its output into the flow's log, raise :class:`StageFailed` on failure.

    ``timeout_s`` (the run's params.yaml ``flows.stage_timeout_s``; 0 = none): past it the stage's whole
    process group gets TERM, then KILL 10 s later, and the run fails as timed out (not retried)."""
    full_env = {**os.environ, **(env or {})}
    # The venv's bin first, so `dvc` and the `python` of dvc.yaml commands are this environment's.
    full_env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{full_env.get('PATH', '')}"
    # A progress bar redraws its line with "\r"; in the flow's log that is one line per redraw (see below).
    full_env.setdefault("TQDM_MININTERVAL", str(PROGRESS_EVERY_S))
    process = subprocess.Popen(
        list(cmd),
        cwd=cwd,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own group: a timeout ends the stage and whatever it started
    )
    lines: list[str] = []

    def pump() -> None:
        assert process.stdout is not None
        stream = io.TextIOWrapper(process.stdout, encoding="utf-8", errors="replace", newline="")
        for line in progress_filtered(stream):
            lines.append(line)
            print(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        process.wait(timeout=timeout_s or None)
    except subprocess.TimeoutExpired:
        timed_out = True
        _end_group(process)
        lines.append(f"run_stage: no result after {timeout_s:g}s (flows.stage_timeout_s); stopped it")
    except BaseException:  # the flow itself is cancelled or timed out: take the stage down with it
        _end_group(process)
        raise
    reader.join(10)
    output = "\n".join(lines) + ("\n" if lines else "")
    if timed_out or process.returncode != 0:
        raise StageFailed(cmd, process.returncode if not timed_out else 124, output, timed_out)
    return output


def _end_group(process: subprocess.Popen) -> None:
    for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def progress_filtered(stream: Iterable[str], every_s: float = PROGRESS_EVERY_S) -> Iterator[str]:
    """The lines of a stage's output for the flow's log, with progress bars thinned out.

    ``stream`` yields pieces ending in "\n" or "\r" (a text stream opened with ``newline=""``). A piece ending
    in "\r" alone is a bar redrawing its line: it is passed on only when ``every_s`` seconds have gone by since
    the last one passed on, so a long bar shows in the log now and then and a short one not at all. A bar's last
    state, ended by "\n", is an ordinary line; blank pieces (a bar erasing itself) are dropped."""
    last = time.monotonic()
    for piece in stream:
        text = piece.rstrip("\r\n")
        if not text.strip():
            continue
        if piece.endswith("\r"):
            now = time.monotonic()
            if now - last < every_s:
                continue
            last = now
        yield text


def stage_task(**options: Any) -> Any:
    """The Prefect task decorator for a step that runs a stage: never cached (DVC or the stage decides what is
    up to date), retried only when it failed the transient way (retry_if_transient), as often as the run's
    ``flows.retries`` say once :func:`retried` has applied them."""
    from prefect import task
    from prefect.cache_policies import NO_CACHE

    return task(cache_policy=NO_CACHE, retry_condition_fn=retry_if_transient, **options)


def retry_if_transient(task, task_run, state) -> bool:  # noqa: ANN001 (Prefect's callback signature)
    """Prefect retry condition: retry a failed stage only when it exited with EXIT_TRANSIENT, or a registry
    call in the flow's own process failed the same typed way."""
    try:
        state.result()
    except StageFailed as failure:
        return failure.transient
    except Exception as error:  # noqa: BLE001 (classified below, by type only)
        return transient_error(error)
    return False


# MLflow's REST error codes that mean "the server or its artifact store had a hiccup", not "you asked wrong".
TRANSIENT_MLFLOW_CODES = {"TEMPORARILY_UNAVAILABLE", "INTERNAL_ERROR", "REQUEST_LIMIT_EXCEEDED"}


def transient_error(error: BaseException) -> bool:
    """A failure in the flow's own process worth retrying: the tracking server or artifact store did not
    answer, a lock or lease timed out. Decided by type (and MLflow's error code), never by message text."""
    from sentcl_mlflow.errors import TRANSIENT, unreachable

    if isinstance(error, TRANSIENT + (ConnectionError, TimeoutError)):
        return True
    if unreachable(error):  # MLflow's MlflowException around a refused or timed-out connection
        return True
    try:
        import requests

        if isinstance(error, requests.exceptions.ConnectionError | requests.exceptions.Timeout):
            return True
    except ImportError:
        pass
    return str(getattr(error, "error_code", "")) in TRANSIENT_MLFLOW_CODES


def ensure_promotion_limit() -> None:
    """Create the global concurrency limit (1 slot) if the server lacks it; without it `concurrency` would
    silently not limit anything."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(PROMOTION_LIMIT)
        except ObjectNotFound:
            try:
                client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name=PROMOTION_LIMIT, limit=1)
                )
            except ObjectAlreadyExists:
                pass


@contextmanager
def promotion_slot(wait_s: float) -> Iterator[None]:
    """The one promotion slot of the Prefect server (queues flows fairly), waited for at most ``wait_s`` (params
    ``promotion.wait_s``); the gate takes its lease in the registry inside it, which is what serialises
    promotions for anyone reaching the store, flow or not."""
    from prefect.concurrency.sync import concurrency

    ensure_promotion_limit()
    with concurrency(PROMOTION_LIMIT, occupy=1, strict=True, timeout_seconds=wait_s):
        yield


def run_tags_env(tags: dict[str, str]) -> dict[str, str]:
    """Extra MLflow run tags for the stages a flow starts (read by sentcl_mlflow.runs.run_tags)."""
    merged = json.loads(os.environ.get("SENTCL_RUN_TAGS") or "{}")
    merged.update(tags)
    return {"SENTCL_RUN_TAGS": json.dumps(merged)}


def check_prefect_api(timeout_s: float = 5) -> None:
    """With PREFECT_API_URL set, the server must answer (and accept PREFECT_API_AUTH_STRING) before a flow
    starts: otherwise one line, not a minute of retries and a traceback. A server that does not answer (or
    answers 5xx) is :class:`PrefectUnavailable` (exit 75: try again); a refused auth string exits 2."""
    import base64
    import urllib.error
    import urllib.request

    url = os.environ.get("PREFECT_API_URL")
    if not url:
        return
    request = urllib.request.Request(url.rstrip("/") + "/admin/version")
    auth = os.environ.get("PREFECT_API_AUTH_STRING")
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            return
    except urllib.error.HTTPError as e:
        if e.code == 401:
            raise ServiceUnavailable(
                f"Prefect API {url} refused the request: set PREFECT_API_AUTH_STRING"
            ) from None
        if e.code < 500:
            return
        raise PrefectUnavailable(f"Prefect API {url} answers {e.code}; is the server healthy?") from None
    except (OSError, urllib.error.URLError) as e:
        raise PrefectUnavailable(
            f"Prefect API {url} is unreachable ({getattr(e, 'reason', e)}): start it (make serve) or unset "
            "PREFECT_API_URL to run without a server"
        ) from None


class ServiceUnavailable(Exception):
    """A server the command needs refused its credentials (exit 2)."""


class PrefectUnavailable(ServiceUnavailable):
    """The Prefect API did not answer (refused, reset, timed out, 5xx): trying again later may work (75)."""


def prefect_unreachable(error: BaseException) -> BaseException | None:
    """The Prefect client's failed connection behind ``error`` (Prefect talks httpx; MLflow, requests), or
    None. A 5xx answer counts: a server shutting down or restarting answers 503."""
    import httpx

    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, httpx.TransportError):
            return error
        if isinstance(error, httpx.HTTPStatusError) and error.response.status_code >= 500:
            return error
        error = error.__cause__ or error.__context__
    return None


@contextmanager
def cli_errors(name: str) -> Iterator[None]:
    """One line instead of a traceback: exit 2 for what a person must act on (no champion, bad credentials,
    a refused account), 75 when trying again may work (MLflow or Prefect died or hung, the lease stayed
    busy)."""
    from sentcl_mlflow.errors import one_line, typed_exit

    _quiet_prefect_outages()
    try:
        yield
    except PrefectUnavailable as e:
        print(f"{name}: {e} (exit {EXIT_TRANSIENT}: try again)", file=sys.stderr)
        raise SystemExit(EXIT_TRANSIENT) from None
    except Exception as e:
        # The table (sentcl_mlflow.errors) by type: 75 as the stages, 2 for what a person must act on, and a
        # "--version 12" that is not there (RESOURCE_DOES_NOT_EXIST): said, no traceback.
        known = typed_exit(name, e, (ServiceUnavailable,), missing_is_bad_input=True)
        if known is not None:
            raise SystemExit(_say(known)) from None
        lost = prefect_unreachable(e)  # the Prefect server died or hung mid-run: before MLflow's check,
        if lost is not None:  # whose socket errors deep in httpx's chain would name the wrong server
            _drop_unsent_prefect_logs()
            print(
                f"{name}: Prefect API {os.environ.get('PREFECT_API_URL')} stopped answering "
                f"({type(lost).__name__}) (exit {EXIT_TRANSIENT}: try again)",
                file=sys.stderr,
            )
            raise SystemExit(EXIT_TRANSIENT) from None
        known = one_line(name, e)  # the server died or hung mid-call (75), refused the account (2)
        if known is None:
            raise
        raise SystemExit(_say(known)) from None


class _NoOutageTraceback:
    """A logging filter: a record whose exception is the Prefect server gone (the engine failing to report
    a state to it) keeps its message and loses its traceback; the CLI ends with one line saying so."""

    def filter(self, record) -> bool:  # noqa: ANN001 (a logging.LogRecord)
        error = record.exc_info[1] if record.exc_info else None
        if error is not None and prefect_unreachable(error) is not None:
            record.exc_info, record.exc_text = None, None
        return True


def _quiet_prefect_outages() -> None:
    import logging

    for name in ("prefect.flow_runs", "prefect.task_runs"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _NoOutageTraceback) for f in logger.filters):
            logger.addFilter(_NoOutageTraceback())


def _drop_unsent_prefect_logs() -> None:
    """With the Prefect server gone, the flow run's log lines still queued for its API cannot be sent:
    Prefect's log worker would print "--- Error logging to API ---" for them at exit, after the one line.
    Drained here, with what it writes to stderr dropped (it only says that the same server is gone)."""
    import contextlib

    try:
        from prefect.logging.handlers import APILogWorker
    except ImportError:
        return
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            APILogWorker.drain_all(timeout=10)
        except Exception:  # noqa: BLE001 (best effort: the one line below is what matters)
            pass


def _say(known: tuple[int, str] | None) -> int:
    assert known is not None  # one_line knows every type cli_errors hands it
    print(known[1], file=sys.stderr)
    return known[0]
