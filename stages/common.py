"""What every stage shares: the repository root, the one table of paths, and params.yaml."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sentcl import params_yaml

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"
RAW = DATA / "raw"  # fetch: SentEval layout + MANIFEST.json
PROCESSED = DATA / "processed"  # validate: pairs.parquet, nli.parquet
REPORTS = ROOT / "reports"  # validate: validation.json
MODELS = ROOT / "models"  # training stages: sentence-transformers folders
CHECKPOINTS = ROOT / "checkpoints"  # resume state, removed when a stage completes
METRICS = ROOT / "metrics"  # uncached metrics and curves (git-tracked)
PLOTS = ROOT / "plots"
SHARED_MIRROR = ROOT.parent / "shared" / "senteval"  # the team mirror beside a checkout


def load_params(path: Path | None = None) -> dict[str, Any]:
    with open(path or ROOT / "params.yaml") as f:
        return params_yaml.load(f)


def offline_hub() -> None:
    """The bundled model needs no hub; keep transformers from asking one unless the user opted in."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


# Exit codes every stage and flow uses. A flow retries a stage only on EXIT_TRANSIENT (BSD's EX_TEMPFAIL:
# "try again later": a tracking server or lock that did not answer); never on a word in the output.
EXIT_BAD_INPUT = 2
EXIT_TRANSIENT = 75
