"""What every stage shares: the repository root, the one table of paths, and params.yaml."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

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
        return yaml.safe_load(f)


def offline_hub() -> None:
    """The bundled model needs no hub; keep transformers from asking one unless the user opted in."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
