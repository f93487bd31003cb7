"""MLflow tracking, registry and the promotion gate: the one module that talks to MLflow.

Used by the stages and the flows alike; sentcl never imports it.
(Interface fixed first so stages can call it; the issue-5 work fills in the bodies.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def log_stage(
    stage: str,
    params: dict[str, Any],
    metrics: dict[str, float] | None = None,
    curves_csv: Path | None = None,
    inputs: list[Path] | None = None,
    artifacts: list[Path] | None = None,
    tags: dict[str, str] | None = None,
) -> str | None:
    """Log one finished stage as one MLflow run and return its run id.

    ``params`` is flattened; ``curves_csv`` (columns step, loss, lr, stsb_dev, ...) becomes metrics by step;
    ``inputs`` are data paths whose DVC hashes are recorded; ``artifacts`` are uploaded files or folders.
    """
    return None
