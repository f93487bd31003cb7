"""Experiments: params.yaml overrides, from a profile (profiles/<name>.yaml) and ``--set``, run as a DVC
experiment once they pass every check ``check_params`` makes, so a refused value never reaches params.yaml.

    make exp SET="transfer.lr=1e-5 seed=1"                              # --set ... --run
    make exp PROFILE=paper                                              # profiles/paper.yaml --run
    python -m stages.profile profiles/paper.yaml --set seed=1           # print the dvc exp run command only
    python -m stages.profile --smoke --model DIR --processed DIR        # every profile, 2 steps, tiny model

``dvc exp run -S`` writes its values into params.yaml before the pipeline's first stage (``check_params``) can
refuse one, and leaves them there. Here the overrides are applied to a copy in memory and checked first: a value
``check_params`` would refuse is one line naming the key, exit 2, and DVC is never started; params.yaml stays as
it was and ``dvc status`` shows nothing stale. A checked value goes to DVC as JSON (``-S key=value``), which DVC
reads as the check did. A profile may add keys that params.yaml does not have (e.g. ``transfer.base.steps``): they
become DVC's ``+key=value`` (append) overrides. ``--smoke`` runs each profile's training stages for 2 steps on a
small model and data, so a profile meant for a GPU cannot rot unnoticed (``make test`` does this).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from sentcl.params import Params, ParamsError, as_overrides, load_yaml, merge, parse_override
from stages.check_params import check
from stages.common import ROOT, SHARED_MIRROR, fail, load_params, params_arguments


def set_flags(profile: Path, params: Mapping[str, Any]) -> list[str]:
    """``dvc exp run``'s ``-S`` flags for ``profile``'s values over ``params``."""
    return [f"-S={override}" for override in as_overrides(load_yaml(Path(profile).read_text()) or {}, params)]


def experiment_overrides(params: Params, profile: Path | None, overrides: Sequence[str]) -> list[str]:
    """A profile's values, then ``overrides`` (``key=value``; ``+key=value`` adds a key), each value as JSON."""
    own = as_overrides(load_yaml(Path(profile).read_text()) or {}, params) if profile else []
    for override in overrides:
        key, value, adds = parse_override(override, params.label)
        own.append(f"{'+' if adds else ''}{key}={json.dumps(value, separators=(',', ':'))}")
    return own


def refused(params: Params, overrides: Sequence[str]) -> int:
    """0 when ``params`` with ``overrides`` pass every check of ``check_params``; else its one line is printed
    and the exit code (2) returned."""
    try:
        check(params.overlaid(overrides))
    except ValueError as exc:
        print(params.relabel(str(exc)), file=sys.stderr)
        return 2
    except SystemExit as exc:  # a training config's own check has printed its one line
        return int(exc.code or 2)
    return 0


def smoke(
    profile: Path, params: Params, model: Path, processed: Path, raw: Path, work: Path
) -> dict[str, Any]:
    """Run ``profile``'s training stages for 2 steps on ``model`` (tracking off); their records
    (``metrics/train/<stage>.json``), by stage. A profile that distils learns from ``model`` itself as the teacher
    (the teacher stage run on it: a folder is a valid ``teacher.model``)."""
    from sentcl.training.data import TEXT_CHOICES
    from sentcl.training.recipes import transfer_objective
    from stages import base, joint, pretrain_nli, transfer
    from stages import teacher as teacher_stage

    params = merge(params, load_yaml(Path(profile).read_text()) or {})
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
    for recipe in ("base", "nli", "joint", "distillation", "tsdae"):  # overlays with steps of their own
        overlay = params["transfer"].get(recipe) or {}
        if "steps" in overlay:
            overlay["steps"] = 2
        if "eval_steps" in overlay:
            overlay["eval_steps"] = 1
    params_file = work / "params.yaml"
    params_file.write_text(yaml.safe_dump(params))
    models = work / "models"
    common = ["--params", str(params_file), "--processed", str(processed), "--models-dir", str(models)]
    common += ["--metrics-dir", str(work / "metrics"), "--checkpoints-dir", str(work / "checkpoints")]
    base.main(["--params", str(params_file), "--output", str(models / "base")])
    pretrain_nli.main(common)
    joint.main(common)
    if any(transfer_objective(params, init) == "distill" for init in ("base", "nli", "joint")):
        teacher_stage.main(
            ["--params", str(params_file), "--model", str(model), "--output", str(work / "teacher")]
            + ["--processed", str(processed), "--raw", str(raw)]
        )
        common += ["--teacher-vectors", str(work / "teacher")]
    for init in ("base", "nli", "joint"):
        transfer.main([*common, "--init", init, "--raw", str(raw), "--max-texts", "64"])
    return {
        path.stem: json.loads(path.read_text())
        for path in sorted((work / "metrics" / "train").glob("*.json"))
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("profile", nargs="*", help="profiles/<name>.yaml (--smoke: any number, default all)")
    parser.add_argument("--run", action="store_true", help="run `dvc exp run` instead of printing it")
    parser.add_argument(
        "--name", help="experiment name (default: the profile's file name; DVC's own without one)"
    )
    parser.add_argument("--smoke", action="store_true", help="run each profile for 2 steps on --model")
    parser.add_argument("--model", help="--smoke: a small model folder")
    parser.add_argument("--processed", help="--smoke: folder with pairs.parquet and nli.parquet")
    parser.add_argument("--raw", default=str(SHARED_MIRROR), help="--smoke: SentEval folder (texts: consert)")
    params_arguments(parser)
    args = parser.parse_args(argv)
    params = load_params(
        args.params
    )  # the file DVC writes the experiment's values into; --set is checked below
    if args.smoke:
        if not (args.model and args.processed):
            parser.error("--smoke needs --model and --processed")
        for profile in args.profile or sorted((ROOT / "profiles").glob("*.yaml")):
            with tempfile.TemporaryDirectory(prefix="sentcl-smoke-") as tmp:
                smoke(
                    Path(profile), params, Path(args.model), Path(args.processed), Path(args.raw), Path(tmp)
                )
            print(f"{profile}: every training stage ran")
        return
    if len(args.profile) > 1 or not (args.profile or args.overrides):
        parser.error("give one profile, --set KEY=VALUE, or both")
    profile = Path(args.profile[0]) if args.profile else None
    try:
        overrides = experiment_overrides(params, profile, args.overrides)
    except ParamsError as exc:
        fail(str(exc))
    code = refused(params, overrides)  # before DVC writes anything: a refused value leaves params.yaml alone
    if code:
        raise SystemExit(code)
    name = args.name or (profile.stem if profile else None)
    command = [sys.executable, "-m", "dvc", "exp", "run", *(["-n", name] if name else [])]
    command += [f"-S={override}" for override in overrides]
    print(" ".join(shlex.quote(part) for part in ["dvc", *command[3:]]))
    if args.run:
        raise SystemExit(subprocess.run(command).returncode)


if __name__ == "__main__":
    main()
