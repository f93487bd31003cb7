"""What the flows share: running a stage as a subprocess, transient-failure retries, the promotion limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from stages.common import ROOT

PROMOTION_LIMIT = "sentcl-promotion"
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
    # Every progress-bar refresh becomes a line of the flow's log: one every 30 s is enough there.
    full_env.setdefault("TQDM_MININTERVAL", "30")
    process = subprocess.Popen(
        list(cmd), cwd=cwd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line)
        print(line.rstrip())
    process.wait()
    output = "".join(lines)
    if process.returncode != 0:
        raise StageFailed(cmd, process.returncode, output)
    return output


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
