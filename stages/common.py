"""What every stage shares: the repository root, the one table of paths, and params.yaml."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from sentcl.params import FILE, ROOT, Params, ParamsError, read_params
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


class OneLineParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose refusal of the command line is one line on stderr, exit code 2."""

    def error(self, message: str) -> NoReturn:
        fail(f"{self.prog}: {message} (--help lists the options)")


def argument_parser(doc: str | None, **options: Any) -> argparse.ArgumentParser:
    """An entry point's parser: its description is the first line of ``doc`` (the module's docstring), a bad
    option is one line and exit code 2 (:class:`OneLineParser`)."""
    description = (doc or "").strip().split("\n")[0] or None
    return OneLineParser(description=description, **options)


def params_arguments(parser: argparse.ArgumentParser) -> None:
    """``--params FILE`` and ``--set KEY=VALUE``: what an entry point reads (``load_params(args.params,
    args.overrides)``) and gives again to every stage it starts (``Params.command``)."""
    parser.add_argument("--params", help="params file (default: params.yaml)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a params value for this run, as `dvc exp run -S` takes it: transfer.lr=1e-5 (+KEY=VALUE adds a key)",
    )


def load_params(path: Path | str | None = None, overrides: Sequence[str] = ()) -> Params:
    """An entry point's one read of params.yaml (or ``path``) with ``overrides``
    (:func:`sentcl.params.read_params`); a missing, unreadable or malformed file, or an override that names no
    key, is one line on stderr naming it, exit code 2."""
    try:
        return read_params(path, overrides)
    except ParamsError as exc:
        fail(str(exc))


def params_label(params: Mapping[str, Any] | None = None) -> str:
    """The file ``params`` was read from, as the user named it; "params.yaml" for any other mapping."""
    return getattr(params, "label", FILE)


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
