"""What the flows share: running a stage as a subprocess, transient-failure retries, the promotion limit."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from stages.common import ROOT

PROMOTION_LIMIT = "sentcl-promotion"
PROGRESS_EVERY_S = 30  # at most one redraw of a progress bar per this many seconds in a flow's log
# Output that marks a failure worth retrying: locks, networks, servers coming up. A bug or bad data is not.
TRANSIENT = (
    "unable to acquire lock",
    "lock is held",
    "connection refused",
    "connection reset",
    "connectionerror",
    "timed out",
    "timeout",
    "temporary failure",
    "is unreachable",
    "503 service unavailable",
    "502 bad gateway",
    "too many requests",
)


class StageFailed(RuntimeError):
    def __init__(self, cmd: Sequence[str], returncode: int, output: str) -> None:
        self.cmd, self.returncode, self.output = list(cmd), returncode, output
        tail = "\n".join(output.strip().splitlines()[-25:])
        super().__init__(f"{' '.join(cmd)} exited {returncode}:\n{tail}")

    @property
    def transient(self) -> bool:
        text = self.output.lower()
        return any(marker in text for marker in TRANSIENT)


def run_stage(cmd: Sequence[str], env: dict[str, str] | None = None, cwd: Path = ROOT) -> str:
    """Run a stage command, stream its output into the flow's log, raise :class:`StageFailed` on failure."""
    full_env = {**os.environ, **(env or {})}
    # The venv's bin first, so `dvc` and the `python` of dvc.yaml commands are this environment's.
    full_env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{full_env.get('PATH', '')}"
    # A progress bar redraws its line with "\r"; in the flow's log that is one line per redraw (see below).
    full_env.setdefault("TQDM_MININTERVAL", str(PROGRESS_EVERY_S))
    process = subprocess.Popen(
        list(cmd), cwd=cwd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    lines: list[str] = []
    assert process.stdout is not None
    for line in progress_filtered(
        io.TextIOWrapper(process.stdout, encoding="utf-8", errors="replace", newline="")
    ):
        lines.append(line)
        print(line)
    process.wait()
    output = "\n".join(lines) + ("\n" if lines else "")
    if process.returncode != 0:
        raise StageFailed(cmd, process.returncode, output)
    return output


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


def retry_if_transient(task, task_run, state) -> bool:  # noqa: ANN001 (Prefect's callback signature)
    """Prefect retry condition: retry a failed stage only when its output looks transient."""
    try:
        state.result()
    except StageFailed as failure:
        return failure.transient
    except Exception:
        return False
    return False


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
def promotion_slot() -> Iterator[None]:
    """The one promotion slot of the Prefect server (spans machines); the gate adds its file lock inside."""
    from prefect.concurrency.sync import concurrency

    ensure_promotion_limit()
    with concurrency(PROMOTION_LIMIT, occupy=1, strict=True):
        yield


def run_tags_env(tags: dict[str, str]) -> dict[str, str]:
    """Extra MLflow run tags for the stages a flow starts (read by stages.tracking.run_tags)."""
    merged = json.loads(os.environ.get("SENTCL_RUN_TAGS") or "{}")
    merged.update(tags)
    return {"SENTCL_RUN_TAGS": json.dumps(merged)}
