"""The nightly path, end to end: the retrain flow on a SICK sentence split, against a registered champion.

What a team's nightly inbox run does, measured on data with held-out labels: SICK-R's sentences are split in
two halves by sentence (seeded, the same split as ``make bench-domain``); the text half is dropped in an inbox
of the run's own and ``python -m flows.retrain`` runs on it as the nightly deployment runs it: **without**
``--domain-dev`` (label-free: a held-out share of the text in two parts, the teacher's agreement on pairs within
one part selects, on pairs within the other the gate judges) and, with ``--with-dev``, a second time **with** it
(up to 500 scored SICK train/trial pairs inside the text half), each in its own MLflow store (a sqlite file in the
work folder). Before the retrain, the starting model (params ``model.name``) is registered there and becomes
champion (the evaluate and export stages, as ``make run`` registers its base model), so the retrain starts from
the champion and its gate compares the retrained candidate with it. Then the champion each run left is
downloaded (its files checked) and scored beside the base model on SICK's test pairs, split by what the run
trained on and read (seen / unseen / mixed / read: a test pair none of whose sentences was trained on but one of
which selection or the gate read, a held-out sentence or one of STS-B dev, SICK-R trial or the dev pairs, is not
unseen; each counted), and on STS-B dev. The test pairs are read once per run, after it finished.

    python -m benchmarks.bench_nightly [--with-dev] [--work DIR] [--json FILE]
    python -m benchmarks.bench_nightly --mode labelled --work DIR       # one of the two runs
    python -m benchmarks.bench_nightly --collect-only --work DIR --with-dev  # score what the runs left

Ends with two lines per run: the gate's verdict against the champion and the pairs it judged on (and those
selection read), then the gains on seen, unseen, mixed and read pairs, STS-B dev's change and the flow's wall
time, against the goal (the retrained model promoted; seen and unseen +2.0, STS-B dev down by 0.5 at most; with
``--domain-dev`` unseen +2.5).
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

from benchmarks.bench_domain import (
    guard_pairs,
    read_keys,
    score,
    sick_split,
    test_splits,
    write_text,
    write_tsv,
)
from sentcl.evaluation.seen import READ, SPLITS
from sentcl.params import Params
from sentcl.registry.rules import GateConfig
from sentcl.retrain.run import judged_on_line
from sentcl.training.data import read_seen, stsb_dev
from stages.common import PROCESSED, RAW, ROOT, load_params, offline_hub, params_arguments
from stages.training import load_pairs

GOALS = {"label-free": 2.0, "labelled": 2.5}  # unseen-pair gain; seen +2.0 and STS-B dev -0.5 for both


def register_starting_model(
    params: Params, folder: Path, env: dict[str, str], raw: Path = RAW, processed: Path = PROCESSED
) -> dict[str, Any]:
    """Params ``model.name`` registered in the store of ``env`` and made champion, as ``make run`` registers its
    base model: the evaluate stage scores it (on ``raw``), export builds its folder, register registers it and runs the gate (on
    ``processed``'s dev splits), which promotes the first version of an empty registry. Returns the register
    stage's summary (version, the gate's verdict); a starting model not made champion stops here."""
    from sentcl.model.encoder import resolve_model_path

    model, out = f"base={resolve_model_path(params['model']['name'])}", folder / "starting-model"
    evaluate = {"--model": model, "--output": out / "sts.json", "--no-progress": True, "--data": raw}
    export = {"--sts": out / "sts.json", "--model": model, "--output": out / "export", "--data": raw}
    export |= {"--summary": out / "export-summary.json", "--train-metrics": out / "train"}
    register = {"--release": out / "export", "--summary": out / "export.json", "--processed": processed}
    steps = (("stages.evaluate", evaluate), ("stages.export", export), ("stages.register", register))
    for stage, flags in steps:
        if subprocess.run(params.command(stage, flags), cwd=ROOT, env=env).returncode:
            raise SystemExit(
                f"bench-nightly: registering the starting model: {stage} failed; its log is above"
            )
    summary = json.loads((out / "export.json").read_text())
    if (summary.get("gate") or {}).get("decision") != "promoted":
        raise SystemExit(f"bench-nightly: the starting model did not become champion: {summary.get('gate')}")
    return summary


def run_flow(
    params: Params, mode: str, sentences: list[str], dev: Path | None, work: Path, collect_only: bool
) -> dict[str, Any]:
    """``python -m flows.retrain`` on ``sentences``, dropped in an inbox of the run's own (the flow archives what
    it read), against a store of its own where the starting model is registered champion first; the champion it
    leaves (downloaded, files checked), what it trained on, the files selection and the gate read, the gate's
    verdict. ``collect_only``: the flow ran in ``work`` already; only read what it left."""
    folder = work / mode
    text = folder / "inbox" / "domain.txt"
    env = dict(
        os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{folder / 'mlflow.db'}", SENTCL_INBOX=str(text.parent)
    )
    for key in ("PREFECT_API_URL", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        env.pop(key, None)  # the flow runs in-process, against this run's own store
    cmd = params.command(
        "flows.retrain", {"--domain-text": text, "--work-dir": folder / "work", "--domain-dev": dev}
    )
    wall = None
    if not collect_only:
        if folder.exists():
            raise SystemExit(
                f"bench-nightly: {folder} exists: give a fresh --work, or --collect-only to score it"
            )
        start = register_starting_model(params, folder, env)
        print(
            f"bench-nightly: {mode}: the starting model {params['model']['name']} is champion version "
            f"{start['registered_version']} (stsb_dev {start['stsb_dev']:.2f}); the retrain starts from it",
            flush=True,
        )
        write_text(sentences, text)
        print(f"bench-nightly: {mode}: {' '.join(cmd[1:])}", flush=True)
        started = time.perf_counter()
        done = subprocess.run(cmd, cwd=ROOT, env=env)
        wall = round(time.perf_counter() - started, 1)
        if done.returncode:
            raise SystemExit(
                f"bench-nightly: the {mode} retrain failed (exit {done.returncode}); its log is above"
            )
    records = sorted((folder / "work" / "metrics" / "train").glob("*.json"))
    train = [json.loads(p.read_text()) for p in records]
    trained = sorted({s for p in records for s in read_seen(p.parent.parent / "seen" / f"{p.stem}.txt")})
    summary = json.loads((folder / "work" / "retrain.json").read_text())  # the flow's, in its kept folder
    judged = summary.get("judged_on") or {}
    files = [Path(judged[role]["file"]) if judged[role]["file"] else None for role in ("selection", "gate")]
    held = [folder / "work" / f"heldout-{part}.txt" for part in ("selection", "gate")]
    os.environ["MLFLOW_TRACKING_URI"] = env["MLFLOW_TRACKING_URI"]
    from sentcl_mlflow.errors import NoChampionError
    from sentcl_mlflow.registry.download import download_alias
    from sentcl_mlflow.registry.names import CHAMPION

    shutil.rmtree(folder / "champion", ignore_errors=True)
    try:
        production = GateConfig.from_params(params).model_name
        champion: str | None = str(download_alias(CHAMPION, folder / "champion", production))
    except NoChampionError:
        champion = None  # nothing registered or promoted: the team keeps the base model
    return {
        "champion": champion,
        "trained": trained,
        "read": (files, held),
        "flow_wall_s": wall,
        "runs": [{k: r.get(k) for k in ("best_step", "steps", "selected_on", "beat_init")} for r in train],
        "gate": summary.get("gate"),
        "judged_on": judged,
        "heldout": summary.get("heldout"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--with-dev", action="store_true", help="also run with --domain-dev (the labelled path)"
    )
    parser.add_argument(
        "--mode", nargs="+", choices=list(GOALS), help="which runs (default: label-free[, labelled])"
    )
    parser.add_argument("--work", help="scratch folder, kept (default: a temporary one, printed)")
    parser.add_argument(
        "--collect-only", action="store_true", help="score what the runs in --work left; run nothing"
    )
    parser.add_argument("--json", help="also write the results here")
    params_arguments(parser)
    args = parser.parse_args(argv)
    if args.collect_only and not args.work:
        parser.error("--collect-only needs --work")
    offline_hub()
    params = load_params(args.params, args.overrides)
    from sentcl_mlflow.store import TrackingConfig, bound_requests

    bound_requests(TrackingConfig.from_params(params))  # the champion's download (params tracking:)
    if not (PROCESSED / "pairs.parquet").is_file():
        raise SystemExit(f"bench-nightly: {PROCESSED}/pairs.parquet: missing; run `dvc repro validate` first")
    pairs = load_pairs(PROCESSED)
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-nightly-")).resolve()
    text_half, dev, test = sick_split(pairs, params["seed"])
    dev_file = write_tsv(dev, work / "dev.tsv")
    print(
        f"bench-nightly: {len(text_half):,} sentences, {len(dev):,} dev pairs, {len(test):,} test pairs; {work}"
    )
    chosen = args.mode or ["label-free", *(["labelled"] if args.with_dev else [])]
    backend = params["evaluate"]["backend"]
    sets, guards = {"stsb_dev": stsb_dev(pairs)}, guard_pairs(pairs)
    before = score(params["model"]["name"], test, sets, backend)
    results: dict[str, Any] = {}
    for mode in chosen:
        run = run_flow(
            params, mode, text_half, dev_file if mode == "labelled" else None, work, args.collect_only
        )
        promoted = (run["gate"] or {}).get("decision") == "promoted"  # the retrained model, over the champion
        # Not promoted: the champion is still the starting model, scored already.
        after = score(run["champion"], test, sets, backend) if promoted else before
        read = read_keys(*run["read"], guards)  # what selection and the gate read: never unseen
        b, a = (test_splits(test, s["test_cosines"], run["trained"], read) for s in (before, after))
        gains = {
            s: round(a[s]["spearman"] - b[s]["spearman"], 2)
            for s in (*SPLITS, READ)
            if a[s]["spearman"] is not None
        }
        row = {k: v for k, v in run.items() if k not in ("trained", "read")}
        row |= {"trained_sentences": len(run["trained"]), "read_sentences": len(read)}
        row |= {"before": b, "after": a, "gains": gains, "stsb_dev": [before["stsb_dev"], after["stsb_dev"]]}
        row["goal"] = bool(
            promoted
            and gains.get("seen", 0) >= 2.0
            and gains.get("unseen", 0) >= GOALS[mode]
            and after["stsb_dev"] - before["stsb_dev"] >= -0.5
        )
        results[mode] = row
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    if args.json:
        Path(args.json).write_text(
            json.dumps({"work": str(work), "load": load, "runs": results}, indent=2) + "\n"
        )
    for mode, r in results.items():
        gate = r["gate"] or {}
        print(
            f"bench-nightly: {mode}: gate {gate.get('decision', 'not run')} against the registered champion "
            f"(champion now version {gate.get('champion_after')}); "
            + (judged_on_line(r["judged_on"]) if r["judged_on"] else "")
        )
        counts = ", ".join(f"{r['after'][s]['pairs']:,} {s}" for s in (*SPLITS, READ))
        print(
            f"bench-nightly: {mode}: test pairs {counts} ({READ}: no sentence trained on, one read by selection "
            f"or the gate, of {r['read_sentences']:,} read sentences)"
        )
        kept = "promoted the retrained model" if gate.get("decision") == "promoted" else "kept the champion"
        print(
            f"bench-nightly: {mode}: {kept}; "
            + ", ".join(f"{s} {g:+.2f} ({r['after'][s]['pairs']:,} pairs)" for s, g in r["gains"].items())
            + f"; STS-B dev {r['stsb_dev'][0]:.2f} -> {r['stsb_dev'][1]:.2f}; whole flow "
            + (
                f"{r['flow_wall_s']:.0f} s (load now {load})"
                if r["flow_wall_s"]
                else "not timed in this call"
            )
            + f"; goal (seen +2.0, unseen +{GOALS[mode]}, STS-B dev -0.5 at most) "
            + ("met" if r["goal"] else "not met")
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
