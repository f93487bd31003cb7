"""The paper's analyses, one command each; none is part of `dvc repro` and none logs or registers anything.

    python -m stages.analyze space          # alignment/uniformity + cosine by gold bucket, before and after training
    python -m stages.analyze freq-tokens    # Spearman with the top-k frequent tokens left out of mean pooling
    python -m stages.analyze aug-grid       # 5 x 5 view pairs in unsupervised transfer -> heat-map
    python -m stages.analyze few-shot       # 1 / 10 / 100 / 1000 / 10000 / all target texts
    python -m stages.analyze temperature    # 0.01 .. 1
    python -m stages.analyze batch-size

Each writes its table under metrics/analysis/ and its plot under plots/ (PNG; dvc.yaml's top-level `plots`
lists them for `dvc plots show`). The training sweeps run `python -m stages.transfer` once per setting on a
scratch copy of params.yaml, with tracking off, and score every result on STS-B dev and test.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from sentcl.evaluation.analysis_runs import (
    SWEEPS,
    freq_tokens_finding,
    models_before_after,
    run_freq_tokens,
    run_space,
    run_sweep,
    sweep_finding,
)
from sentcl.model.encoder import resolve_model_path
from sentcl.params import Params, load_yaml
from stages.common import METRICS, MODELS, PLOTS, RAW, ROOT, load_params, offline_hub

log = logging.getLogger("stages.analyze")
ANALYSIS = METRICS / "analysis"


def transfer_cell(cell: Params, work: Path, name: str, init: str, steps: int) -> None:
    """One `stages.transfer` run of a sweep cell with its own params file, tracking off, everything under ``work``."""
    options = {"--init": init, "--recipe": "base", "--output": work / name, "--stage": name}
    options |= {
        "--metrics-dir": work / "metrics",
        "--checkpoints-dir": work / "checkpoints",
        "--steps": steps,
    }
    cmd = cell.command("stages.transfer", options)
    env = dict(os.environ, SENTCL_MLFLOW="0", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    subprocess.run(cmd, check=True, cwd=ROOT, env=env)


def _value(text: str) -> Any:
    return load_yaml(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("analysis", choices=["space", "freq-tokens", "aug-grid", *SWEEPS])
    parser.add_argument("--data", type=Path, default=RAW, help="SentEval layout folder (default data/raw)")
    parser.add_argument(
        "--model", action="append", default=[], help="space: extra NAME=DIR; freq-tokens: the model"
    )
    parser.add_argument("--max-k", type=int, default=50, help="freq-tokens: largest k")
    parser.add_argument("--init", help="sweeps: model to transfer from (default: params model.name)")
    parser.add_argument("--steps", type=int, default=30, help="sweeps: transfer steps per run")
    parser.add_argument(
        "--max-texts", type=_value, default=2000, help="sweeps: target texts per run (all = every)"
    )
    parser.add_argument(
        "--values", help="sweeps: comma-separated values (aug-grid: views) instead of the defaults"
    )
    parser.add_argument(
        "--cells",
        choices=["all", "single"],
        default="all",
        help="aug-grid: every pair, or each view with itself and with none",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="sweeps: a transfer.base recipe override for every cell, e.g. encoder_dropout=true",
    )
    parser.add_argument("--tag", help="sweeps: suffix of the output files (metrics/analysis, plots)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    offline_hub()
    params = load_params()
    ANALYSIS.mkdir(parents=True, exist_ok=True)
    started = time.time()
    if args.analysis == "space":
        models = models_before_after(params, args.model, MODELS)
        run_space(models, args.data, ANALYSIS, PLOTS, log=log)
        found = "alignment, uniformity and cosine by gold-score bucket"
        written = ["metrics/analysis/collapse.csv", "plots/collapse.png", "plots/align_uniform.png"]
    elif args.analysis == "freq-tokens":
        if args.model:
            label, _, model = (
                args.model[0].rpartition("=") if "=" in args.model[0] else ("", "", args.model[0])
            )
        else:
            label, model = params["model"]["name"], resolve_model_path(params["model"]["name"])
        rows = run_freq_tokens(model, args.data, args.max_k, ANALYSIS, PLOTS, label or None, log=log)
        found = freq_tokens_finding(rows)
        written = ["metrics/analysis/freq_tokens.csv", "plots/freq_tokens.png"]
    else:
        init = args.init or resolve_model_path(params["model"]["name"])
        rows = run_sweep(
            args.analysis,
            params,
            args.data,
            init,
            args.steps,
            [_value(v) for v in args.values.split(",")] if args.values else None,
            args.max_texts,
            functools.partial(transfer_cell, init=init, steps=args.steps),
            ANALYSIS,
            PLOTS,
            init_label=args.init or params["model"]["name"],
            cells_kind=args.cells,
            extra={key: _value(value) for key, _, value in (item.partition("=") for item in args.set)},
            tag=args.tag,
            log=log,
        )
        name = args.analysis.replace("-", "_") + (f"_{args.tag}" if args.tag else "")
        found = sweep_finding(rows)
        written = [f"metrics/analysis/{name}.csv", f"plots/{name}.png"]
    # One line that says what the run found and where it wrote it.
    print(f"analyze {args.analysis}: {found} -> {', '.join(written)} ({time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
