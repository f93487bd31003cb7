"""Does a retrain pay on its domain? Held-out test Spearman and STS-B dev, before and after, per method.

A domain is a triple: unlabeled text (what the retrain reads), scored dev pairs (what its checkpoint selection
reads, ``--domain-dev``) and scored test pairs that no run ever sees. The default triple is SICK from
data/processed/pairs.parquet: the SICK-R train sentences as text, the trial (dev) pairs as dev, the test pairs
held out (many test sentences also occur in the train text: the transductive setting ConSERT uses; the run
prints how many). Each method is the real transfer stage, run as a subprocess with tracking off in a scratch
folder; ``tsdae+contrastive`` is two runs: TSDAE, then the contrastive transfer from its output (the retrain
flow's ``retrain.method`` values, sentcl.domain.RETRAIN_METHODS). Several ``--method`` run side by side, each
from the same starting model.

``distill`` and ``distill+contrastive`` learn from params ``teacher.model`` (``none``: one line, exit 2). The
teacher stage encodes the text and the dev pairs once, and scores teacher and starting model on the dev pairs
(both numbers printed and in the JSON, ``teacher``); where the teacher is not better by more than
``registry.min_delta`` the method is reported as skipped, untrained, as the retrain flow skips it.

It starts from the base model (params ``model.name``) by default; ``--from champion`` downloads the registered
champion (read only) and ``--from DIR`` takes a model folder. It registers nothing, in no store: the gate's
decision is the registry's own rule (sentcl.registry.gate_decision, params ``registry:``) applied to the STS-B
dev and domain dev scores before and after; the retrain flow's gate also checks every STS task.

    make bench-domain BENCH_DOMAIN_ARGS="--method contrastive tsdae tsdae+contrastive --steps 60"
    python -m benchmarks.bench_domain --text FILE_OR_DIR --dev DEV.tsv --test TEST.tsv --from base|champion|DIR

TSV files: sentence1<TAB>sentence2<TAB>score, a header line allowed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sentcl.data.domain import RETRAIN_METHODS, retrain_teacher, teacher_not_better
from sentcl.evaluation.sts import STSEvaluator
from sentcl.params import ParamsError
from sentcl.registry.rules import GateConfig, gate_decision
from sentcl.training.data import stsb_dev
from stages.common import PROCESSED, ROOT, load_params, offline_hub
from stages.training import fail, load_pairs, read_texts
from stages.transfer import read_domain_dev

METHODS = RETRAIN_METHODS  # params.yaml retrain.method picks one of these for the retrain flow
Pairs = list[tuple[str, str, float]]
# The bar for a retrain that pays: held-out test up by this much, STS-B dev down by no more than that.
GOAL_TEST_GAIN, GOAL_STSB_DROP = 1.5, 0.5


def sick_triple(pairs: pd.DataFrame) -> tuple[list[str], Pairs, Pairs]:
    """SICK-R: the train pairs' unique sentences (sorted), the trial (dev) pairs, the test pairs."""
    sick = pairs[pairs.task == "SICK-R"]

    def scored(split: str) -> Pairs:
        part = sick[sick.split == split]
        return list(zip(part.sentence1, part.sentence2, part.score.astype(float), strict=True))

    train = sick[sick.split == "train"]
    return sorted(set(train.sentence1) | set(train.sentence2)), scored("dev"), scored("test")


def write_tsv(pairs: Pairs, path: Path) -> Path:
    path.write_text("".join(f"{a}\t{b}\t{score}\n" for a, b, score in pairs), encoding="utf-8")
    return path


def score(model: str, sets: dict[str, Pairs], backend: str) -> dict[str, float]:
    """Spearman x 100 of ``model`` on each set of pairs, every unique sentence encoded once (as evaluate does)."""
    from sentcl.model.fast_encode import FastEncoder

    unique = sorted({s for pairs in sets.values() for a, b, _ in pairs for s in (a, b)})
    vectors = FastEncoder(model, pooling="last-avg", backend=backend)(unique)
    index = {s: i for i, s in enumerate(unique)}

    def encode(sentences: Sequence[str]) -> np.ndarray:
        return vectors[[index[s] for s in sentences]]

    return {name: round(STSEvaluator(pairs, name)(encode), 2) for name, pairs in sets.items()}


def transfer(
    init: str, objective: str, name: str, args: argparse.Namespace, text: str, dev: Path, work: Path
) -> tuple[Path, dict[str, Any], float]:
    """One run of the transfer stage with ``--domain-dev``; returns its model folder, metrics and wall time."""
    output = work / name
    cmd = [sys.executable, "-m", "stages.transfer", "--init", init, "--recipe", args.recipe]
    cmd += ["--texts", text, "--domain-dev", str(dev), "--objective", objective, "--output", str(output)]
    cmd += ["--stage", name, "--metrics-dir", str(work / "metrics"), "--checkpoints-dir", str(work / "ckpt")]
    cmd += ["--processed", str(args.processed)] + (["--params", args.params] if args.params else [])
    # A TSDAE step (8 sentences, one pass) costs far less than a contrastive one (64 sentences, two views).
    steps = args.tsdae_steps if objective == "tsdae" and args.tsdae_steps else args.steps
    cmd += ["--steps", str(steps)] if steps else []
    cmd += ["--max-texts", str(args.max_texts)] if args.max_texts else []
    cmd += ["--teacher-vectors", str(work / "teacher")] if objective == "distill" else []
    print(f"bench-domain: {name}: {objective} from {init}", flush=True)
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=stage_env())
    if done.returncode:
        raise SystemExit(f"bench-domain: the {name} run failed (exit {done.returncode}); its log is above")
    metrics = json.loads((work / "metrics" / "train" / f"{name}.json").read_text())
    return output, metrics, time.perf_counter() - start


def stage_env() -> dict[str, str]:
    return dict(os.environ, SENTCL_MLFLOW="0", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))


def check_teacher(
    teacher: str, init: str, args: argparse.Namespace, text: str, dev: Path, work: Path, min_delta: float
) -> dict[str, Any]:
    """The teacher stage on the text and the dev pairs (``work/teacher``, what distill learns from), with the
    starting model scored beside the teacher; ``nothing_to_distil``: the one line, when it is not better."""
    cmd = [sys.executable, "-m", "stages.teacher", "--model", teacher, "--texts", text, "--no-benchmark"]
    cmd += ["--output", str(work / "teacher"), "--domain-dev", str(dev), "--student", init]
    cmd += ["--processed", str(args.processed)] + (["--params", args.params] if args.params else [])
    print(f"bench-domain: teacher {teacher} on the text and the dev pairs", flush=True)
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=stage_env())
    if done.returncode:
        raise SystemExit(f"bench-domain: the teacher stage failed (exit {done.returncode}); its log is above")
    scores = json.loads((work / "teacher" / "teacher.json").read_text())["domain_dev"]
    line = teacher_not_better(teacher, scores["teacher"], scores["student"], min_delta)
    print(
        f"bench-domain: domain dev: teacher {scores['teacher']:.2f}, starting model {scores['student']:.2f}"
        + (f"; {line}" if line else ""),
        flush=True,
    )
    seconds = round(time.perf_counter() - start, 1)
    return {"model": teacher, **scores, "nothing_to_distil": line, "wall_s": seconds}


def table(before: dict[str, float], results: dict[str, dict[str, Any]]) -> str:
    """Markdown: one column per method, each score with its change from the starting model."""
    names = list(results)
    lines = ["| | before | " + " | ".join(names) + " |", "|---" * (len(names) + 2) + "|"]
    for key, label in (
        ("test", "held-out test Spearman"),
        ("stsb_dev", "STS-B dev"),
        ("domain_dev", "domain dev (selection)"),
    ):
        cells = [f"{r['after'][key]:.2f} ({r['after'][key] - before[key]:+.2f})" for r in results.values()]
        lines.append(f"| {label} | {before[key]:.2f} | " + " | ".join(cells) + " |")
    steps = [
        "; ".join(f"{run['objective']} {run['best_step']}/{run['steps']}" for run in r["runs"])
        for r in results.values()
    ]
    lines.append("| selected step / steps run | | " + " | ".join(steps) + " |")
    lines.append("| train wall s | | " + " | ".join(f"{r['wall_s']:.0f}" for r in results.values()) + " |")
    lines.append(
        "| gate (STS-B dev + domain dev rules) | | "
        + " | ".join(r["gate"]["decision"] for r in results.values())
        + " |"
    )
    goal = [
        "yes"
        if r["after"]["test"] - before["test"] >= GOAL_TEST_GAIN
        and r["after"]["stsb_dev"] - before["stsb_dev"] >= -GOAL_STSB_DROP
        else "no"
        for r in results.values()
    ]
    lines.append(
        f"| test +{GOAL_TEST_GAIN}, STS-B dev -{GOAL_STSB_DROP} at most | | " + " | ".join(goal) + " |"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--text", help="unlabeled domain text: file or folder (default: SICK train sentences)"
    )
    parser.add_argument("--dev", help="scored dev pairs, TSV (default: SICK trial pairs)")
    parser.add_argument("--test", help="scored held-out test pairs, TSV (default: SICK test pairs)")
    parser.add_argument("--method", nargs="+", choices=list(METHODS), default=["contrastive"])
    parser.add_argument(
        "--from",
        dest="init",
        default="base",
        help="base (params model.name), champion (the registered one, read only) or a model folder",
    )
    parser.add_argument("--recipe", default="base", help="transfer.<recipe> of params.yaml (default: base)")
    parser.add_argument("--steps", type=int, help="override transfer steps (each run of a method)")
    parser.add_argument("--tsdae-steps", type=int, help="steps of a tsdae run (default: --steps)")
    parser.add_argument("--max-texts", help="use a seeded sample of this many sentences")
    parser.add_argument("--params", help="params file (default: params.yaml)")
    parser.add_argument(
        "--processed", default=str(PROCESSED), help="folder with pairs.parquet (STS-B dev, SICK)"
    )
    parser.add_argument(
        "--backend", help="encoder for scoring: onnx | torch (default: params evaluate.backend)"
    )
    parser.add_argument("--work", help="scratch folder (default: a temporary one, removed at the end)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    offline_hub()
    params = load_params(Path(args.params) if args.params else None)
    gate = GateConfig.from_params(params)
    if args.init not in ("base", "champion") and not Path(args.init).is_dir():
        fail(f"--from {args.init}: neither base, champion nor a model folder")
    try:
        teachers = {retrain_teacher(params, method) for method in args.method} - {None}
    except ParamsError as exc:
        fail(str(exc))
    teacher = teachers.pop() if teachers else None  # every method reads the one teacher.model
    backend = args.backend or params["evaluate"]["backend"]
    if not (Path(args.processed) / "pairs.parquet").is_file():
        fail(f"{args.processed}/pairs.parquet: missing; run `dvc repro validate` first")
    pairs = load_pairs(Path(args.processed))

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-domain-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        init = starting_model(args.init, params, work)
        sick_text, sick_dev, sick_test = (
            sick_triple(pairs) if not (args.text and args.dev and args.test) else ([], [], [])
        )
        text_path = args.text or str(write_text(sick_text, work / "text.txt"))
        texts = read_texts(Path(text_path))
        dev = read_domain_dev(args.dev, "--dev") if args.dev else sick_dev
        test = read_domain_dev(args.test, "--test") if args.test else sick_test
        dev_path = Path(args.dev) if args.dev else write_tsv(dev, work / "dev.tsv")
        test_sentences = {s for a, b, _ in test for s in (a, b)}
        shared = len(test_sentences & set(texts))
        print(
            f"bench-domain: text {len(texts):,} sentences, dev {len(dev):,} pairs, test {len(test):,} pairs "
            f"held out; {shared:,} of {len(test_sentences):,} test sentences also occur in the text"
            + (" (transductive, as ConSERT)" if shared else ""),
            flush=True,
        )
        sets = {"test": test, "stsb_dev": stsb_dev(pairs), "domain_dev": dev}
        before = score(init, sets, backend)
        checked = (
            check_teacher(teacher, init, args, text_path, dev_path, work, gate.min_delta) if teacher else None
        )
        results: dict[str, dict[str, Any]] = {}
        skipped: dict[str, str] = {}
        # Runs by their chain of objectives from the init: tsdae+contrastive starts from the very run `tsdae`
        # made (same init, text and settings: CPU training repeats bit for bit), so it is not trained twice;
        # its wall time still counts the reused run.
        finished: dict[tuple[str, ...], tuple[Path, dict[str, Any], float]] = {}
        for method in args.method:
            if checked and checked["nothing_to_distil"] and "distill" in METHODS[method]:
                skipped[method] = checked["nothing_to_distil"]
                print(f"bench-domain: {method}: skipped, untrained", flush=True)
                continue
            model, runs, wall = init, [], 0.0
            for i, objective in enumerate(METHODS[method]):
                chain = tuple(METHODS[method][: i + 1])
                if chain not in finished:
                    name = f"{method.replace('+', '-')}-{i}"
                    finished[chain] = transfer(model, objective, name, args, text_path, dev_path, work)
                else:
                    print(f"bench-domain: {method}: reusing the {' then '.join(chain)} run", flush=True)
                output, metrics, seconds = finished[chain]
                model, wall = str(output), wall + seconds
                runs.append({"objective": objective, **metrics})
            after = score(model, sets, backend)
            promote, reasons = gate_decision(
                (after["stsb_dev"], {}, after["domain_dev"]),
                (before["stsb_dev"], {}, before["domain_dev"]),
                gate,
            )
            decision = "would promote" if promote else "would reject"
            results[method] = {
                "after": after,
                "runs": runs,
                "wall_s": round(wall, 1),
                "gate": {"decision": decision, "reasons": reasons},
            }
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\nbench-domain from {args.init} ({init}); load average {load}\n")
    if results:
        print(table(before, results))
    for method, line in skipped.items():
        print(f"\n{method}: skipped: {line}")
    if args.json:
        record = {"from": init, "before": before, "methods": results, "load_average": load}
        record |= {"teacher": checked, "skipped": skipped} if checked else {}
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
    return 0


def starting_model(choice: str, params: dict[str, Any], work: Path) -> str:
    """The model every method starts from: base (params model.name), the registered champion (downloaded into
    ``work``, its weights checked; read only) or a model folder."""
    if choice == "base":
        return params["model"]["name"]
    if choice != "champion":
        return choice
    from sentcl_mlflow.errors import NoChampionError
    from sentcl_mlflow.registry.download import download_alias
    from sentcl_mlflow.registry.names import CHAMPION
    from sentcl_mlflow.store import TrackingAuthError, TrackingUnavailableError

    try:
        folder = download_alias(CHAMPION, work / "champion")
    except (NoChampionError, TrackingUnavailableError, TrackingAuthError) as exc:
        fail(f"--from champion: {exc}")
    print(f"bench-domain: from the registered champion ({folder})", flush=True)
    return str(folder)


def write_text(sentences: list[str], path: Path) -> Path:
    path.write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
    return path


if __name__ == "__main__":
    raise SystemExit(main())
