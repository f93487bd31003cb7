"""What every stage shares: the repository root, the one table of paths, and params.yaml."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import yaml

from sentcl.params import ROOT, load_yaml
from sentcl_mlflow.exit_codes import EXIT_BAD_INPUT

DATA = ROOT / "data"
RAW = DATA / "raw"  # fetch: SentEval layout + MANIFEST.json
PROCESSED = DATA / "processed"  # validate: pairs.parquet, nli.parquet
SEEN = DATA / "seen"  # training stages: <stage>.txt, the sentences each trained on (evaluate splits by them)
REPORTS = ROOT / "reports"  # validate: validation.json
MODELS = ROOT / "models"  # training stages: sentence-transformers folders
CHECKPOINTS = ROOT / "checkpoints"  # resume state, removed when a stage completes
METRICS = ROOT / "metrics"  # uncached metrics and curves (git-tracked)
PLOTS = ROOT / "plots"
SHARED_MIRROR = ROOT.parent / "shared" / "senteval"  # the team mirror beside a checkout


# Which file each mapping ``load_params`` returned came from, so messages name the file actually read ("params.yaml"
# unless --params named another). Keyed by id, holding the mapping itself so that an id is never reused.
_loaded: dict[int, tuple[dict[str, Any], str]] = {}


def params_label(params: dict[str, Any] | None = None) -> str:
    """The file ``params`` was read from, as the user named it; "params.yaml" for any other mapping."""
    entry = _loaded.get(id(params)) if params is not None else None
    return entry[1] if entry is not None and entry[0] is params else "params.yaml"


def relabel(message: str, label: str) -> str:
    """A config error says ``params.yaml: ...``; name the file actually read instead."""
    prefix = "params.yaml:"
    return label + message[len("params.yaml") :] if message.startswith(prefix) else message


def load_params(path: Path | None = None) -> dict[str, Any]:
    """params.yaml (or ``path``) as a mapping. A missing, unreadable or malformed file is one line on stderr
    naming it, exit code 2."""
    file = Path(path) if path else ROOT / "params.yaml"
    label = str(path) if path else "params.yaml"
    try:
        with open(file) as f:
            params = load_yaml(f)
    except FileNotFoundError:
        fail(f"{label}: no such params file")
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"{label}: cannot be read ({exc.__class__.__name__}: {exc})")
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f":{where.line + 1}" if where is not None else ""
        fail(f"{label}{line}: not valid YAML ({getattr(exc, 'problem', None) or exc})")
    if not isinstance(params, dict):
        fail(f"{label}: must be a mapping of sections, got {type(params).__name__}")
    _loaded[id(params)] = (params, label)
    return params


def fail(message: str) -> NoReturn:
    """Bad input: one line on stderr, exit code 2 (EXIT_BAD_INPUT)."""
    print(message, file=sys.stderr)
    raise SystemExit(EXIT_BAD_INPUT)


def missing_model(name: str) -> str | None:
    """Why ``name`` (a folder, or a Hugging Face id already resolved from the bundled model's name) is no model
    this machine can load, said at once and offline; None when it may load. Offline (HF_HUB_OFFLINE, the default
    here), an id is loadable only from the local Hugging Face cache; online it is left to the loader."""
    if Path(name).expanduser().exists():
        return None
    path_like = name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name
    if path_like:
        return f"{name}: no such model folder"
    if os.environ.get("HF_HUB_OFFLINE", "").lower() not in ("1", "true", "yes", "on"):
        return None
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(name, "config.json")
    except ValueError:  # not even a valid id (HFValidationError)
        cached = None
    if isinstance(cached, str):
        return None
    return f"{name}: no such model folder, and not a Hugging Face model in the local cache (HF_HUB_OFFLINE=1)"


def offline_hub() -> None:
    """The bundled model needs no hub; keep transformers from asking one unless the user opted in."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
