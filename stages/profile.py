"""Profiles: YAML files of params.yaml overrides (profiles/<name>.yaml), run as DVC experiments.

    dvc exp run -n paper $(python -m stages.profile profiles/paper.yaml)     # what `make exp PROFILE=paper` runs
    python -m stages.profile --smoke --model DIR --processed DIR              # every profile, 2 steps, tiny model

A profile may add keys that params.yaml does not have (e.g. ``transfer.base.steps``): they become DVC's
``+key=value`` (append) overrides. ``--smoke`` runs each profile's training stages for 2 steps on a small model
and data, so a profile meant for a GPU cannot rot unnoticed (``make test`` does this).
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from sentcl.params import as_overrides, load_yaml, merge
from stages.common import ROOT, SHARED_MIRROR, load_params


def set_flags(profile: Path, params: Mapping[str, Any]) -> list[str]:
    """``dvc exp run``'s ``-S`` flags for ``profile``'s values over ``params``."""
    return [f"-S={override}" for override in as_overrides(load_yaml(Path(profile).read_text()) or {}, params)]


def smoke(profile: Path, model: Path, processed: Path, raw: Path, work: Path) -> None:
    """Run ``profile``'s training stages for 2 steps on ``model`` (tracking off)."""
    from sentcl.training.data import TEXT_CHOICES
    from stages import base, joint, pretrain_nli, transfer

    params = merge(load_params(), load_yaml(Path(profile).read_text()) or {})
    params["model"]["name"] = str(model)
    params["train"].update(eval_steps=1, device="cpu")
    texts = params["transfer"]["texts"]
    if texts not in TEXT_CHOICES and not Path(texts).exists():  # a GPU corpus (e.g. wiki1m) is not here
        print(f"{profile}: transfer.texts {texts} is not here; the smoke run trains on heldout")
        params["transfer"]["texts"] = "heldout"
    elif texts == "consert" and not raw.is_dir():  # a clone without the SentEval mirror beside it
        print(
            f"{profile}: transfer.texts consert needs the SentEval mirror ({raw}); the smoke run trains on heldout"
        )
        params["transfer"]["texts"] = "heldout"
    for section in ("pretrain_nli", "joint", "transfer"):
        params[section].update(steps=2, batch_size=min(8, params[section]["batch_size"]))
        for recipe in ("base", "nli", "joint"):
            if section == "transfer" and "steps" in params[section][recipe]:
                params[section][recipe]["steps"] = 2
    params_file = work / "params.yaml"
    params_file.write_text(yaml.safe_dump(params))
    models = work / "models"
    common = ["--params", str(params_file), "--processed", str(processed), "--models-dir", str(models)]
    common += ["--metrics-dir", str(work / "metrics"), "--checkpoints-dir", str(work / "checkpoints")]
    base.main(["--params", str(params_file), "--output", str(models / "base")])
    pretrain_nli.main(common)
    joint.main(common)
    for init in ("base", "nli", "joint"):
        transfer.main([*common, "--init", init, "--raw", str(raw), "--max-texts", "64"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("profile", nargs="*", help="profiles/<name>.yaml files (--smoke: default all)")
    parser.add_argument("--run", action="store_true", help="run `dvc exp run` instead of printing it")
    parser.add_argument("--name", help="experiment name (default: the profile's file name)")
    parser.add_argument("--smoke", action="store_true", help="run each profile for 2 steps on --model")
    parser.add_argument("--model", help="--smoke: a small model folder")
    parser.add_argument("--processed", help="--smoke: folder with pairs.parquet and nli.parquet")
    parser.add_argument("--raw", default=str(SHARED_MIRROR), help="--smoke: SentEval folder (texts: consert)")
    args = parser.parse_args(argv)
    if args.smoke:
        if not (args.model and args.processed):
            parser.error("--smoke needs --model and --processed")
        for profile in args.profile or sorted((ROOT / "profiles").glob("*.yaml")):
            with tempfile.TemporaryDirectory(prefix="sentcl-smoke-") as tmp:
                smoke(Path(profile), Path(args.model), Path(args.processed), Path(args.raw), Path(tmp))
            print(f"{profile}: every training stage ran")
        return
    if len(args.profile) != 1:
        parser.error("give one profile")
    name = args.name or Path(args.profile[0]).stem
    command = ["dvc", "exp", "run", "-n", name, *set_flags(Path(args.profile[0]), load_params())]
    print(" ".join(shlex.quote(part) for part in command))
    if args.run:
        raise SystemExit(subprocess.run(command).returncode)


if __name__ == "__main__":
    main()
