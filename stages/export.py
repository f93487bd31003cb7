"""Stage `export`: the best checkpoint by STS-B dev becomes a release folder; `register` registers it.

    python -m stages.export                       # DVC stage: metrics/sts.json + models/<checkpoint>
    python -m stages.export --sts FILE --model NAME=DIR ... --output DIR   # the retrain flow's candidates

The init counts as a candidate (``base``, or the champion's weights in a retrain), so a run whose training
did not help exports its init again, tagged ``beat_init=false`` when registered; only the gate moves ``champion``.

The release folder (``sentcl.registry.release``) is a sentence-transformers folder plus ``onnx/model.onnx``, checked
against PyTorch to 1e-4, and a model card (README.md) with data licences, params, the STS table, the weights'
sha256 and the git commit. Registering it is the `register` stage's (``stages.register``): DVC may restore
this stage from its run-cache, and a restored folder must not pretend it was registered.

It also writes ``onnx/model_int8.onnx`` (params.yaml ``export``; ``sentcl.registry.int8``) and scores it on the
benchmark (``--data``): shipped only when the dev splits stay within ``export.int8_max_dev_drop`` of fp32,
otherwise one line says so and the folder is fp32 only. Static quantisation calibrates on the text the run
trained on: ``--calibration-text`` (the retrain flow passes its domain text), else ``transfer.texts``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from sentcl.model.quantize import QuantizeConfig
from sentcl.params import ParamsError
from sentcl.registry import release
from sentcl.registry.rules import GateConfig
from stages.cli import BadInput, run_cli
from stages.common import (
    METRICS,
    MODELS,
    RAW,
    argument_parser,
    load_params,
    offline_hub,
    params_arguments,
)

OUTPUT = MODELS / "export"


def _parse_models(values: list[str]) -> dict[str, Path]:
    folders: dict[str, Path] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep:
            raise SystemExit(f"export: --model expects NAME=DIR, got {value!r}")
        folders[name] = Path(path)
    return folders


def calibration_text(path: Path | None, params: dict[str, Any], folder: Path) -> list[str]:
    """The training text for static int8 calibration: ``path`` (a retrain's domain text) or ``transfer.texts``,
    selected as the transfer stage selects it (``heldout`` drops the dev splits' sentences)."""
    from stages import training

    if path is not None:
        return training.read_texts(path)
    choice = params["transfer"]["texts"]
    if Path(choice).exists():
        return training.read_texts(Path(choice))
    pairs, nli = training.load_pairs(), training.load_nli()
    return training.transfer_texts(choice, pairs, nli, RAW)


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--sts", type=Path, default=METRICS / "sts.json", help="STS table by checkpoint")
    parser.add_argument("--model", action="append", default=[], help="NAME=DIR; default models/<NAME>")
    parser.add_argument("--train-metrics", type=Path, default=METRICS / "train")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    parser.add_argument("--summary", type=Path, default=METRICS / "export.json")
    parser.add_argument(
        "--domain-dev",
        type=Path,
        help="scored pairs (s1<TAB>s2<TAB>score) of the new domain: each checkpoint's domain Spearman",
    )
    parser.add_argument("--data", type=Path, default=RAW, help="SentEval folder the int8 graph is scored on")
    parser.add_argument(
        "--calibration-text",
        type=Path,
        help="file or folder of the training text for static int8 (default: transfer.texts)",
    )
    params_arguments(parser)
    args = parser.parse_args(argv)
    offline_hub()

    from sentcl.data.domain import DomainTextError, read_scored_pairs
    from sentcl_mlflow import store  # git facts for the model card only: export talks to no server
    from sentcl_mlflow.registry import names as registry

    params = load_params(args.params, args.overrides)
    config = GateConfig.from_params(params)  # a wrong registry section stops the stage before any work
    try:
        quantize_config = QuantizeConfig.from_params(params)
    except ParamsError as e:
        raise BadInput(str(e)) from None
    sts = json.loads(args.sts.read_text())
    folders = {name: MODELS / name for name in sts} | _parse_models(args.model)
    if args.domain_dev:
        try:
            pairs = read_scored_pairs(args.domain_dev)
        except DomainTextError as e:
            raise BadInput(f"--domain-dev: {e}") from None
        max_length = int(params["model"]["max_length"])
        for name, row in sts.items():
            if folders.get(name, Path("/-")).exists():
                row["domain_spearman"] = release.domain_spearman(folders[name], pairs, max_length)
                print(f"export: {name} domain Spearman {row['domain_spearman']:.2f} on {len(pairs)} pairs")
    try:
        checkpoint = release.best_existing_checkpoint(sts, folders, config.max_dev_drop)
    except LookupError as e:
        raise SystemExit(f"export: {e}") from None
    beat_init, any_beat = release.beat_init_flags(checkpoint, args.train_metrics)
    calibration = None
    if quantize_config.int8_method == "static":
        calibration = calibration_text(args.calibration_text, params, folders[checkpoint])
    try:
        info = release.build_release(
            checkpoint,
            folders[checkpoint],
            args.output,
            sts,
            params,
            beat_init,
            model_name=registry.target_model_name(config),
            git_commit=store.git_commit(),
            git_dirty=store.git_dirty(),
            quantize_config=quantize_config,
            data_root=args.data,
            calibration=calibration,
            training=release.training_record(checkpoint, args.train_metrics),
        )
    except release.OnnxMismatchError as e:
        raise SystemExit(f"export: {e}") from None
    info["trained_beat_init"] = any_beat
    info["sts_row"] = sts[checkpoint]
    (args.output / "export.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"export: {checkpoint} (stsb_dev {info['stsb_dev']:.2f}) -> {args.output}")
    int8 = info["int8"]  # build_release writes it whenever it is given a QuantizeConfig, as here
    if int8["shipped"]:
        print(
            f"export: int8 ({int8['method']}) stsb_dev {int8['stsb_dev']:.2f}, within "
            f"{int8['max_dev_drop']} of fp32 -> {args.output / int8['file']}"
        )
    else:
        print(f"export: {int8['reason']}")
    summary = release.release_summary(info)
    args.summary.parent.mkdir(parents=True, exist_ok=True)
    args.summary.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli("export", main))
