"""Does a retrain pay on its domain? Test Spearman on seen and unseen sentences, and STS-B dev, per method.

A domain is unlabeled text (what the retrain reads), scored dev pairs (what checkpoint selection reads with
``--domain-dev``) and scored test pairs (read once per run, after training). The default is SICK-R from
data/processed/pairs.parquet split by sentence (seeded, sentcl.data.sentence_split): all SICK sentences cut at
random in two halves; the text is one half; the dev pairs are up to 500 scored SICK train/trial pairs with both
sentences in the text half; the test pairs are SICK's test pairs. Every test score is split by the text each run
actually trained on (sentcl.evaluation.seen): *seen* pairs (both sentences trained on: a transductive gain),
*unseen* pairs (neither, and no sentence that selection or the gate read: what carries to new sentences),
*read* pairs (neither trained on, but a sentence of a held-out part, of the dev pairs, of STS-B dev or of SICK-R
trial) and *mixed*, each with its count; the same sentence by ``sentcl.data.roles.normalise``.

Each method runs twice, as the retrain flow would: *labelled* (``--domain-dev``: selection on the dev pairs,
STS-B dev a guard) and *label-free* (no dev pairs: a distill method holds out ``retrain.heldout_share`` of the
text before the teacher stage, never trained on, in two parts: it selects on the student's agreement with the
teacher on pairs within the selection part, and the gate row judges on pairs within the gate part, which
selection never read; another method selects on STS-B dev). The table says whether the label-free run selected
the same step as the labelled one. Each is the retrain flow's own procedure (``sentcl.retrain``: ``plan``
and ``run``), its stages run as subprocesses with tracking off in a scratch folder; ``tsdae+contrastive`` is two
runs: TSDAE, then the contrastive transfer from its output (the retrain flow's ``retrain.method`` values).
Several ``--method`` run side by side, each from the same starting model.

``distill`` and ``distill+contrastive`` learn from params ``teacher.model`` (``none``: one line, exit 2). The
teacher stage encodes the text once per mode; with the dev pairs it scores teacher and starting model on them
(both numbers printed and in the JSON, ``teacher``); where the teacher is not better by more than
``registry.min_delta`` the method is reported as skipped, untrained, as the retrain flow skips it.

It starts from the base model (params ``model.name``) by default; ``--from champion`` downloads the registered
champion (read only) and ``--from DIR`` takes a model folder. It registers nothing, in no store: the gate's
decision is the registry's own rule (sentcl.registry.rules.gate_decision, params ``registry:``) applied to the STS-B
dev and gate-set scores after against before (the starting model as champion): the gate set is the dev pairs
with labels, the held-out gate part's agreement pairs without; the retrain flow's gate also checks SICK-R trial.

    make bench-domain BENCH_DOMAIN_ARGS="--method contrastive tsdae tsdae+contrastive --steps 60"
    python -m benchmarks.bench_domain --text FILE_OR_DIR --dev DEV.tsv --test TEST.tsv --from base|champion|DIR

``--domain news`` builds a second domain from the mirror the same way: STS-B train's news pairs (MSRpar,
headlines, deft-news) split by sentence, the text half, 500 of its pairs as dev, the other news pairs as test.

TSV files: sentence1<TAB>sentence2<TAB>score, a header line allowed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sentcl.data.roles import selection_sets, sentence_keys
from sentcl.data.sentence_split import draw_dev_pairs, split_sentences
from sentcl.evaluation.benchmark import Subset
from sentcl.evaluation.seen import READ, SPLITS, pair_splits, seen_keys, split_scores
from sentcl.evaluation.sts import STSEvaluator, cosine, spearman100
from sentcl.params import ParamsError
from sentcl.registry.rules import GateConfig, Scores, gate_decision
from sentcl.retrain.config import RETRAIN_METHODS, RetrainConfig
from sentcl.retrain.plan import Plan, Step, plan
from sentcl.retrain.run import Outcome, run
from sentcl.training.data import read_seen, stsb_dev
from stages.common import PROCESSED, RAW, ROOT, load_params, offline_hub, params_arguments
from stages.training import fail, load_pairs, read_texts, seen_file
from stages.transfer import read_domain_dev

METHODS = RETRAIN_METHODS  # params.yaml retrain.method picks one of these for the retrain flow
MODES = ("labelled", "label-free")
Pairs = list[tuple[str, str, float]]
DEV_PAIRS = 500  # the SICK split's dev pairs, at most
# The bar for a retrain that pays: seen and unseen test pairs up by this much, STS-B dev down by no more than that.
GOAL_TEST_GAIN, GOAL_STSB_DROP = 2.0, 0.5


def sick_split(pairs: pd.DataFrame, seed: int, limit: int = DEV_PAIRS) -> tuple[list[str], Pairs, Pairs]:
    """SICK-R split by sentence: the text half (sorted), up to ``limit`` scored train/trial pairs inside it (not
    test pairs) as dev, the test pairs."""
    sick = pairs[pairs.task == "SICK-R"]

    def scored(part: pd.DataFrame) -> Pairs:
        return list(zip(part.sentence1, part.sentence2, part.score.astype(float), strict=True))

    text, _ = split_sentences([*sick.sentence1, *sick.sentence2], seed)
    test = scored(sick[sick.split == "test"])
    dev = draw_dev_pairs(scored(sick[sick.split != "test"]), text, test, limit, seed)
    return text, dev, test


def news_split(
    pairs: pd.DataFrame, raw: Path, seed: int, limit: int = DEV_PAIRS
) -> tuple[list[str], Pairs, Pairs]:
    """A news domain from the mirror: STS-B train's ``main-news`` pairs (MSRpar, headlines, deft-news; the genre is
    column 1 of sts-train.csv) split by sentence as SICK is: the text half, up to ``limit`` of its pairs inside the
    text half as dev, the other news pairs as test (split later into seen, unseen and mixed)."""
    train = pairs[(pairs.task == "STSb") & (pairs.split == "train")]
    csv = (raw / "STS" / "STSBenchmark" / "sts-train.csv").read_text(encoding="utf-8").splitlines()
    news = train[[csv[int(line) - 1].split("\t")[0] == "main-news" for line in train.line]]
    every = list(zip(news.sentence1, news.sentence2, news.score.astype(float), strict=True))
    text, _ = split_sentences([*news.sentence1, *news.sentence2], seed)
    dev = draw_dev_pairs(every, text, [], limit, seed)
    chosen = {(a, b) for a, b, _ in dev}
    return text, dev, [p for p in every if (p[0], p[1]) not in chosen]


def write_tsv(pairs: Pairs, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{a}\t{b}\t{score}\n" for a, b, score in pairs), encoding="utf-8")
    return path


def score(model: str, test: Pairs, sets: dict[str, Pairs], backend: str) -> dict[str, Any]:
    """``model``'s cosines on the test pairs (``test_cosines``, split later by what each run trained on) and its
    Spearman x 100 on each other set of pairs; every unique sentence encoded once (as evaluate does)."""
    from sentcl.model.fast_encode import FastEncoder

    every = [*test, *(p for pairs in sets.values() for p in pairs)]
    unique = sorted({s for a, b, _ in every for s in (a, b)})
    vectors = FastEncoder(model, pooling="last-avg", backend=backend)(unique)
    index = {s: i for i, s in enumerate(unique)}

    def encode(sentences: list[str]) -> np.ndarray:
        return vectors[[index[s] for s in sentences]]

    scores: dict[str, Any] = {name: round(STSEvaluator(p, name)(encode), 2) for name, p in sets.items() if p}
    scores["test_cosines"] = cosine(encode([a for a, _, _ in test]), encode([b for _, b, _ in test]))
    return scores


def test_subset(test: Pairs) -> Subset:
    return Subset(
        "test", "test", *(tuple(p[i] for p in test) for i in (0, 1)), np.array([p[2] for p in test])
    )


def test_splits(
    test: Pairs, cosines: np.ndarray, trained: list[str], read: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """Test Spearman x 100 on all pairs and per split (seen / unseen / mixed relative to ``trained``; read: no
    trained sentence, one whose key is in ``read``, what selection or the gate read)."""
    subset = test_subset(test)
    parts = split_scores([subset], [cosines], seen_keys(trained), read)["tasks"]["test"]
    return {"all": round(spearman100(cosines, subset.gold), 2), **parts}


def read_keys(pair_files: list[Path | None], sentence_files: list[Path], guards: Pairs) -> frozenset[str]:
    """The keys (``normalise``) of every sentence a run's selection or gate read: its scored pairs (the dev
    pairs, or the held-out parts' agreement pairs), its held-out sentences, and the dev guards ``guards``
    (STS-B dev, SICK-R trial)."""
    pairs = [p for path in pair_files if path is not None for p in read_domain_dev(str(path), "--pairs")]
    lines = [s for path in sentence_files if path.is_file() for s in read_texts(path)]
    return sentence_keys([*(s for a, b, _ in [*pairs, *guards] for s in (a, b)), *lines])


def guard_pairs(pairs: pd.DataFrame) -> Pairs:
    """The dev splits selection and the gate read beside a domain's pairs: STS-B dev and SICK-R trial."""
    return [p for rows in selection_sets(pairs).values() for p in rows]


class StageRunner:
    """Runs a retrain's stages as subprocesses with tracking off, and times them. A stage already run with the
    same command (the same init, text and settings: CPU training repeats bit for bit) is not run again: a
    ``tsdae+contrastive`` continues from the very run ``tsdae`` made, whose wall time it still counts."""

    def __init__(self) -> None:
        self.done: set[tuple[str, ...]] = set()
        self.seconds: dict[str, float] = {}  # by output folder

    def __call__(self, step: Step) -> None:
        if tuple(step.command) in self.done:
            print(f"bench-domain: reusing the {step.name} run", flush=True)
            return
        print(f"bench-domain: {step.name} -> {step.output}", flush=True)
        start = time.perf_counter()
        env = dict(os.environ, SENTCL_MLFLOW="0", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
        done = subprocess.run(step.command, cwd=ROOT, env=env)
        if done.returncode:
            raise SystemExit(
                f"bench-domain: the {step.name} stage failed (exit {done.returncode}); its log is above"
            )
        self.done.add(tuple(step.command))
        self.seconds[str(step.output)] = round(time.perf_counter() - start, 1)


def cell(before: float | None, after: float | None, pairs: int | None = None) -> str:
    n = f", {pairs:,} pairs" if pairs is not None else ""
    if before is None or after is None:
        return f"-{n}"
    return f"{before:.2f} -> {after:.2f} ({after - before:+.2f}){n}"


def table(results: dict[str, dict[str, Any]]) -> str:
    """Markdown: one column per method and mode, each score before -> after (change)."""
    names = list(results)
    rows = list(results.values())
    lines = ["| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]

    def add(label: str, cells: list[str]) -> None:
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    add("test, all pairs", [cell(r["before"]["test"]["all"], r["after"]["test"]["all"]) for r in rows])
    for split in (*SPLITS, READ):
        add(
            f"test, {split} pairs" + (" (by selection or the gate)" if split == READ else ""),
            [
                cell(
                    r["before"]["test"][split]["spearman"],
                    r["after"]["test"][split]["spearman"],
                    r["after"]["test"][split]["pairs"],
                )
                for r in rows
            ],
        )
    add("STS-B dev", [cell(r["before"]["stsb_dev"], r["after"]["stsb_dev"]) for r in rows])
    add("selected on", [r["selected_on"] for r in rows])
    for role in ("selection", "gate"):
        add(
            f"{role} set",
            [
                cell(r["before"].get(role), r["after"].get(role), r["judged_on"][role]["pairs"])
                + (f" ({r['judged_on'][role]['part']})" if r["judged_on"][role]["part"] else "")
                for r in rows
            ],
        )
    add("sentences both sets hold", [f"{r['judged_on']['shared_sentences']:,}" for r in rows])
    add(
        "selected step / steps run",
        ["; ".join(f"{x['objective']} {x['best_step']}/{x['steps']}" for x in r["runs"]) for r in rows],
    )
    add("train wall s", [f"{r['wall_s']:.0f}" for r in rows])
    add("gate (STS-B dev + gate set rules)", [r["gate"]["decision"] for r in rows])
    add("same step as labelled", [{None: "", True: "yes", False: "no"}[r.get("same_choice")] for r in rows])
    add(f"seen and unseen +{GOAL_TEST_GAIN}, STS-B dev -{GOAL_STSB_DROP} at most", [goal(r) for r in rows])
    return "\n".join(lines)


def goal(r: dict[str, Any]) -> str:
    gains = [
        (r["after"]["test"][s]["spearman"] or 0.0) - (r["before"]["test"][s]["spearman"] or 0.0)
        for s in ("seen", "unseen")
        if r["after"]["test"][s]["spearman"] is not None
    ]
    stsb = r["after"]["stsb_dev"] - r["before"]["stsb_dev"] >= -GOAL_STSB_DROP
    return "yes" if gains and min(gains) >= GOAL_TEST_GAIN and stsb else "no"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--domain",
        choices=("sick", "news"),
        default="sick",
        help="the built-in domain when --text/--dev/--test are not all given: SICK-R, or STS-B train's news pairs",
    )
    parser.add_argument("--raw", default=str(RAW), help="SentEval folder (--domain news reads the genres)")
    parser.add_argument("--text", help="unlabeled domain text: file or folder (default: the SICK text half)")
    parser.add_argument("--dev", help="scored dev pairs, TSV (default: SICK pairs inside the text half)")
    parser.add_argument("--test", help="scored test pairs, TSV (default: SICK test pairs)")
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
    params_arguments(parser)
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
    params = load_params(args.params, args.overrides)
    gate = GateConfig.from_params(params)
    if args.init == "champion":
        from sentcl_mlflow.store import TrackingConfig, bound_requests

        bound_requests(TrackingConfig.from_params(params))  # the champion's download (params tracking:)
    if args.init not in ("base", "champion") and not Path(args.init).is_dir():
        fail(f"--from {args.init}: neither base, champion nor a model folder")
    try:  # each method's retrain, as the flow reads it (a distill method needs teacher.model)
        configs = {method: RetrainConfig.from_params(params, method) for method in args.method}
    except ParamsError as exc:
        fail(str(exc))
    backend = args.backend or params["evaluate"]["backend"]
    if not (Path(args.processed) / "pairs.parquet").is_file():
        fail(f"{args.processed}/pairs.parquet: missing; run `dvc repro validate` first")
    pairs = load_pairs(Path(args.processed))

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-domain-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        init = starting_model(args.init, params, work)
        own = not (args.text and args.dev and args.test)
        split = news_split if args.domain == "news" else sick_split
        extra = (Path(args.raw),) if args.domain == "news" else ()
        sick_text, sick_dev, sick_test = split(pairs, *extra, params["seed"]) if own else ([], [], [])
        text_path = args.text or str(write_text(sick_text, work / "text.txt"))
        texts = read_texts(Path(text_path))
        text_file = write_text(texts, work / "texts.txt")  # deduplicated, as the retrain flow's
        dev = read_domain_dev(args.dev, "--dev") if args.dev else sick_dev
        test = read_domain_dev(args.test, "--test") if args.test else sick_test
        dev_path = Path(args.dev) if args.dev else write_tsv(dev, work / "dev.tsv")
        labels = list(pair_splits(test_subset(test), seen_keys(texts)))
        print(
            f"bench-domain: text {len(texts):,} sentences, dev {len(dev):,} pairs, test {len(test):,} pairs: "
            + ", ".join(f"{labels.count(s):,} {s}" for s in SPLITS)
            + " relative to the text",
            flush=True,
        )
        sets = {"stsb_dev": stsb_dev(pairs), "domain_dev": dev}
        guards = guard_pairs(pairs)  # every sentence of them is read: no test pair holding one is unseen
        before = score(init, test, sets, backend)
        runner, results, skipped = StageRunner(), {}, {}
        checked: dict[str, Any] | None = None  # the teacher against the starting model on the dev pairs
        free: dict[str, Any] | None = None  # the label-free runs' held-out share
        for method in args.method:
            config = configs[method]
            # A TSDAE step (8 sentences, one pass) costs far less than a contrastive one (64 sentences, 2 views).
            steps = {
                o: args.tsdae_steps if o == "tsdae" and args.tsdae_steps else args.steps
                for o in config.objectives
            }
            options = {"--recipe": args.recipe, "--max-texts": args.max_texts or None}
            # labelled: selection on the dev pairs; label-free: as the nightly run, without
            for mode in MODES:
                where = (text_file, init, work / mode, mode, Path(args.processed))
                rest = (dev_path if mode == "labelled" else None, steps, args.init, options)
                todo = plan(config, params, *where, *rest)
                found = run(todo, runner, lambda line: print(f"bench-domain: {line}", flush=True))
                teacher_wall = runner.seconds.get(str(todo.work / "teacher"))
                if found.teacher and "teacher" in found.teacher and checked is None:
                    checked = {**found.teacher, "wall_s": teacher_wall}
                    print(
                        f"bench-domain: domain dev: teacher {checked['teacher']:.2f}, starting model {checked['student']:.2f}",
                        flush=True,
                    )
                if found.status == "teacher not better":  # untrained, in both modes
                    skipped[method] = found.teacher["nothing_to_distil"]
                    print(f"bench-domain: {method}: skipped, untrained", flush=True)
                    break
                if found.heldout is not None:  # sentences held out, in selection's part and the gate's
                    held = {
                        "heldout": found.heldout["sentences"],
                        "selection_part": found.heldout["selection"],
                    }
                    held |= {"gate_part": found.heldout["gate"]}
                    free = held | {"selection": found.selected_on, "teacher_wall_s": teacher_wall}
                results[f"{method} {mode}"] = measure(
                    todo, found, runner, (test, guards), sets, before, backend, gate
                )
            if method not in skipped:
                chosen = [[r["best_step"] for r in results[f"{method} {m}"]["runs"]] for m in MODES]
                results[f"{method} label-free"]["same_choice"] = chosen[0] == chosen[1]
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    total = time.perf_counter() - started
    print(f"\nbench-domain from {args.init} ({init}); {total:.0f} s wall; load average {load}\n")
    if results:
        print(table(results))
    for method, line in skipped.items():
        print(f"\n{method}: skipped: {line}")
    if args.json:
        record = {"from": init, "methods": results, "load_average": load, "wall_s": round(total, 1)}
        record |= {"text": len(texts), "dev": len(dev), "test": len(test)}
        record |= {"teacher": checked, "label_free": free, "skipped": skipped} if checked else {}
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
    return 0


def measure(
    todo: Plan,
    found: Outcome,
    runner: StageRunner,
    test: tuple[Pairs, Pairs],
    sets: dict[str, Pairs],
    before: dict[str, Any],
    backend: str,
    gate: GateConfig,
) -> dict[str, Any]:
    """A retrain's model scored against the starting model's ``before``: ``outcome`` of the two. ``test``: the
    test pairs and the dev guards (STS-B dev, SICK-R trial), whose sentences are read, never unseen."""
    pairs, guards = test
    trained = sorted({s for r in found.runs for s in read_seen(seen_file(r["stage"], todo.work / "metrics"))})
    files = [found.selection_pairs, found.gate_pairs]
    held = list(todo.heldout_files.values()) if todo.hold_out else []
    read = read_keys(files, held, guards)
    # Label-free, with a teacher: the agreement pairs within each held-out part (selection's, the gate's).
    agreement = {
        role: read_domain_dev(str(path), "--agreement")
        for role, path in zip(("selection", "gate"), files, strict=True)
        if path is not None and found.selected_on == "teacher_agreement"
    }
    if agreement:
        scored = score(todo.init, [], agreement, backend)
        sets, before = {**sets, **agreement}, {**before, **{role: scored[role] for role in agreement}}
    after = score(found.runs[-1]["output"], pairs, sets, backend)
    wall = sum(runner.seconds[r["output"]] for r in found.runs)
    result = outcome(before, after, found, (pairs, trained, read), wall, gate)
    return result | {"judged_on": found.judged_on()}


def outcome(
    before: dict[str, Any],
    after: dict[str, Any],
    found: Outcome,
    test: tuple[Pairs, list[str], frozenset[str]],
    wall: float,
    gate: GateConfig,
) -> dict[str, Any]:
    """One run's before and after: the test split by what it trained on and what its selection and gate read,
    STS-B dev, its selection set and its gate set (what the gate compares beside STS-B dev, as the flow's gate
    does: the dev pairs with labels, the held-out gate part's agreement pairs without)."""
    pairs, trained, read = test
    # Where each role's domain scores are (None: no domain pairs of its own).
    own = {"domain_dev": "domain_dev", "teacher_agreement": "selection"}.get(found.selected_on)
    gate_key = "gate" if found.selected_on == "teacher_agreement" else "domain_dev"
    keys = {"selection": own, "gate": gate_key if found.gate_pairs else None}

    def view(scores: dict[str, Any]) -> dict[str, Any]:
        row = {
            "test": test_splits(pairs, scores["test_cosines"], trained, read),
            "stsb_dev": scores["stsb_dev"],
        }
        return row | {role: scores[key] for role, key in keys.items() if key is not None}

    b, a = view(before), view(after)
    promote, reasons = gate_decision(
        Scores(a["stsb_dev"], {}, a.get("gate")), Scores(b["stsb_dev"], {}, b.get("gate")), gate
    )
    return {
        "before": b,
        "after": a,
        "selected_on": found.selected_on,
        "runs": found.runs,
        "wall_s": round(wall, 1),
        "gate": {"decision": "would promote" if promote else "would reject", "reasons": reasons},
    }


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
        folder = download_alias(CHAMPION, work / "champion", GateConfig.from_params(params).model_name)
    except (NoChampionError, TrackingUnavailableError, TrackingAuthError) as exc:
        fail(f"--from champion: {exc}")
    print(f"bench-domain: from the registered champion ({folder})", flush=True)
    return str(folder)


def write_text(sentences: list[str], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
    return path


if __name__ == "__main__":
    raise SystemExit(main())
