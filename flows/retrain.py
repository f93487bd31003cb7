"""Retraining on new domain text, from the current champion: validate, transfer, evaluate, register, gate.

    python -m flows.retrain [--domain-text FILE_OR_FOLDER] [--domain-dev PAIRS.tsv] [--keep]

Exit code 0 when the flow ran (promoted or not: the gate's decision is printed with its numbers; nothing new
or no gain: said, nothing registered); non-zero when it could not run (bad text or params: 2, anything else:
1). Deployments run the same flow on a cron schedule and when the inbox watcher (flows/watch.py) reports new
files (infra/prefect.yaml).

The inbox (``SENTCL_INBOX``, default ``inbox/``): for text inside it, "new" means "not yet archived". The run
reads the files under the given path outside ``inbox/processed/`` and, after it finished (promoted, rejected or
no gain), moves them to ``inbox/processed/<date>/``; with nothing new it ends at once. No state store: the
folder is the state, on a laptop or a Kubernetes volume alike. A file that is not UTF-8 text is skipped with one
warning line (and archived with the rest); an upload still going (``.part``, ``.tmp``) is left for a later run.

The method is params.yaml ``retrain.method``: contrastive | tsdae | tsdae+contrastive (TSDAE, then the
contrastive transfer from its output) | distill | distill+contrastive. A run in which no step of any transfer beat
its init registers nothing.

A distill method learns from params ``teacher.model`` (``none`` with a distill method: one line, exit 2, before
any work), for the steps ``retrain.transfer`` sets over ``transfer:`` (a nightly budget; ``--steps`` wins). The teacher stage encodes the
domain text and the ``--domain-dev`` pairs into the work folder and scores teacher and student (the init) on
those pairs; a teacher not better by more than ``registry.min_delta`` is said in one line and nothing is trained
or registered (the inbox is archived, as on "no gain"): there is nothing to learn from it. Without
``--domain-dev`` the teacher is not checked, and ``retrain.heldout_share`` of the text is set aside before the
teacher stage, never trained on: selection and the gate read the student's agreement with the teacher on pairs
among those sentences (sentcl.training.agreement; STS-B dev a guard). The summary's
``selected_on``: ``domain_dev``, ``teacher_agreement`` or ``stsb_dev`` (other methods without ``--domain-dev``).

Every step is a stage run as a subprocess (stages.transfer, stages.evaluate, stages.export) so that the
flow adds orchestration only. Work files go to ``runs/retrain/<time>-<sha8>-<random>/`` (two runs on the same
text never share one), removed after a successful run unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.common import (
    check_prefect_api,
    cli_errors,
    flow_config,
    promotion_slot,
    run_stage,
    run_tags_env,
    stage_task,
)
from sentcl.data.domain import (
    RETRAIN_METHODS,
    DomainTextError,
    archive,
    check_inside_inbox,
    check_retrain_input,
    chosen_method,
    new_files,
    read_domain_text,
    read_scored_pairs,
    retrain_method,
    retrain_overrides,
    retrain_teacher,
    teacher_not_better,
    write_sentences,
)
from sentcl.params import Params, ParamsError
from sentcl.registry.rules import DEV_GUARDS, GateConfig
from sentcl.training.agreement import AgreementConfig, hold_out_file
from stages.common import PROCESSED, RAW, ROOT, load_params, params_arguments

RUNS = ROOT / "runs" / "retrain"
PY = sys.executable
SETTINGS = flow_config()


def inbox() -> Path:
    return Path(os.environ.get("SENTCL_INBOX") or ROOT / "inbox").resolve()


def work_folder(sha: str) -> Path:
    """``runs/retrain/<time>-<sha8>-<random>``: the random part keeps two runs on the same text (a retry, an
    event and the nightly run) out of each other's folder."""
    return RUNS / f"{time.strftime('%Y%m%dT%H%M%S')}-{sha[:8]}-{uuid.uuid4().hex[:8]}"


@task(cache_policy=NO_CACHE)
def check_text(domain_text: str, files: list[Path] | None) -> dict[str, Any]:
    """Usable UTF-8 text, at least two distinct sentences: checked before anything is downloaded. A file that
    is not UTF-8 text is skipped with one warning line naming it."""
    return read_domain_text(domain_text, files=files, warn=get_run_logger().warning).summary()


@stage_task(SETTINGS)
def fetch_init(work: Path, base_model: str) -> dict[str, Any]:
    """The champion's folder and its registered scores; the base model when nothing is registered yet.

    Retried (params.yaml ``flows.retries``, ``flows.retry_delay_s`` apart) when MLflow or its artifact store has
    a hiccup (flows.common.transient_error: the server unreachable, a connection reset, MLflow's
    TEMPORARILY_UNAVAILABLE / INTERNAL_ERROR); a weights mismatch or a missing model is not retried."""
    from sentcl_mlflow.registry.download import champion_scores, download_model
    from sentcl_mlflow.registry.names import gate_config

    shutil.rmtree(work / "champion-download", ignore_errors=True)  # a retry starts from a clean folder
    champion = champion_scores()
    if champion is None:
        from sentcl.model.encoder import resolve_model_path

        print(f"retrain: no champion registered yet; starting from the base model {base_model}")
        # A folder, not a hub id: export copies the candidate it picks, and the init is a candidate.
        return {"version": None, "folder": resolve_model_path(base_model), "sts_row": None}
    version, row = champion
    folder = download_model(f"models:/{gate_config().model_name}/{version}", work / "champion-download")
    print(f"retrain: starting from champion version {version} (stsb_dev {row['stsb_dev']})")
    return {"version": str(version), "folder": str(folder), "sts_row": row}


@task(cache_policy=NO_CACHE)
def prepare_text(
    domain_text: str, files: list[Path] | None, init_folder: str, work: Path, max_tokens: int
) -> dict[str, Any]:
    """Deduplicated text for the transfer stage; lines over the init's token limit are counted (the tokenizer
    truncates them there, as every anchor does), not refused."""
    from transformers import AutoTokenizer

    from sentcl.model.encoder import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(init_folder))
    text = read_domain_text(
        domain_text,
        lambda s: len(tokenizer(s, add_special_tokens=True, verbose=False)["input_ids"]),
        max_tokens,
        files=files,
        warn=lambda _line: None,  # check_text said it already
    )
    if text.too_long:
        print(
            f"retrain: {len(text.too_long)} of {len(text.sentences)} sentences are longer than "
            f"model.max_length {max_tokens} tokens: truncated there"
        )
    path = write_sentences(text.sentences, work / "texts.txt")
    return {**text.summary(), "path": str(path)}


@stage_task(SETTINGS)
def ensure_data() -> None:
    """The transfer stage scores STS-B dev from data/processed; DVC brings it up to date if needed."""
    run_stage([PY, "-m", "dvc", "repro", "validate"])


@stage_task(SETTINGS)
def teacher_vectors(
    settings: Params,
    model: str,
    texts: str,
    init: str,
    work: Path,
    env: dict[str, str],
    options: dict[str, Any],
) -> dict[str, Any]:
    """The teacher stage on the domain text (and the domain dev pairs, scored with the init beside it) into
    ``work/teacher``; its record (``teacher.json``). The STS sentences are left out: a retrain reads none."""
    output = work / "teacher"
    flags = {"--model": model, "--texts": texts, "--output": output, "--no-benchmark": True}
    flags |= {"--processed": options.get("processed") or PROCESSED, "--domain-dev": options.get("domain_dev")}
    flags |= {"--student": init if options.get("domain_dev") else None, "--heldout": options.get("heldout")}
    run_stage(settings.command("stages.teacher", flags), env=env)
    return json.loads((output / "teacher.json").read_text())


@stage_task(SETTINGS)
def transfer(
    settings: Params,
    init: str,
    texts: str,
    work: Path,
    stage: str,
    env: dict[str, str],
    objective: str,
    options: dict[str, Any],
) -> dict[str, Any]:
    """One transfer run (``objective`` from ``init``); its model folder and its training record.
    ``options``: steps, domain_dev, agreement, processed, teacher_vectors (None: the stage's defaults)."""
    output = work / "models" / stage
    flags = {"--init": init, "--texts": texts, "--output": output, "--stage": stage, "--objective": objective}
    flags |= {"--metrics-dir": work / "metrics", "--checkpoints-dir": work / "checkpoints"}
    flags |= {"--processed": options.get("processed") or PROCESSED, "--steps": options.get("steps") or None}
    flags |= {"--domain-dev": options.get("domain_dev"), "--agreement": options.get("agreement")}
    flags |= {"--teacher-vectors": options["teacher_vectors"] if objective == "distill" else None}
    run_stage(settings.command("stages.transfer", flags), env=env)
    record = json.loads((work / "metrics" / "train" / f"{stage}.json").read_text())
    return {"stage": stage, "objective": objective, "output": str(output), **record}


@stage_task(SETTINGS)
def evaluate(
    settings: Params, models: dict[str, str], output: Path, env: dict[str, str], raw: str | None = None
) -> dict[str, Any]:
    flags = {"--output": output, "--no-progress": True, "--data": raw or RAW}
    flags |= {"--model": [f"{name}={folder}" for name, folder in models.items()]}
    run_stage(settings.command("stages.evaluate", flags), env=env)
    return json.loads(output.read_text())


@stage_task(SETTINGS)
def export_and_gate(
    settings: Params, options: dict[str, Any], summary: Path, env: dict[str, str]
) -> dict[str, Any]:
    # The slot serialises gates across every flow on this Prefect server; the stage adds its file lock.
    with promotion_slot():
        run_stage(settings.command("stages.export", {**options, "--summary": summary}), env=env)
    return json.loads(summary.read_text())


@flow(name="sentcl-retrain", log_prints=True, timeout_seconds=SETTINGS.flow_timeout_s or None)
def retrain(
    domain_text: str | None = None,
    domain_dev: str | None = None,
    work_dir: str | None = None,
    steps: int | None = None,
    trigger: str = "manual",
    keep: bool = False,
    method: str | None = None,
    params: str | None = None,
    processed: str | None = None,
    raw: str | None = None,
    overrides: list[str] | None = None,
) -> dict[str, Any]:
    """Transfer the champion to ``domain_text``, register the better of init and result, run the gate.

    ``domain_text``: a file or folder; default the inbox (``SENTCL_INBOX``, its new files only).
    ``method``: default params.yaml ``retrain.method``. ``params``: a params file instead of params.yaml, and
    ``overrides`` (``key=value``) over it: the flow reads them once and every stage it starts gets both. ``processed``: a folder with pairs.parquet instead of data/processed
    (then `dvc repro validate` is not run). ``raw``: a SentEval-layout folder instead of data/raw for the
    evaluation before the gate. ``keep``: leave the work folder after a successful run."""
    from prefect.runtime import flow_run

    logger = get_run_logger()
    domain_text = str(domain_text or inbox())
    # Stages run with the repository as working directory: paths a person typed are made absolute here.
    domain_dev, params, processed, raw = (
        str(Path(p).resolve()) if p else None for p in (domain_dev, params, processed, raw)
    )
    check_inside_inbox(domain_text, trigger, inbox())
    files = new_files(domain_text, inbox(), trigger)
    if files is not None and not files:
        print(
            f"retrain: nothing new in {domain_text} (all of it is in {inbox() / 'processed'}); nothing registered"
        )
        return {"status": "nothing new", "registered_version": None, "archived": []}
    settings = load_params(params, overrides or ())
    # What every stage of the retrain reads: params.yaml with retrain.transfer over transfer (a distill run's steps).
    settings = settings.overlaid(retrain_overrides(settings))
    method = chosen_method(settings, method)
    teacher = retrain_teacher(settings, method)  # teacher.model none with a distill method: refused here
    checked = check_text(domain_text, files)
    if domain_dev:
        read_scored_pairs(domain_dev)  # a malformed dev set stops the run before training, not after
    sha = checked["sha256"]
    own_work = not work_dir
    work = Path(work_dir) if work_dir else work_folder(sha)
    work.mkdir(parents=True, exist_ok=not own_work)
    logger.info("domain text %s (%s): %s", domain_text, method, checked)
    env = run_tags_env(
        {
            "domain_text_sha256": sha,
            "domain_text": str(domain_text),
            "trigger": trigger,
            "retrain_method": method,
            "flow": "sentcl-retrain",
            "prefect_flow_run_id": str(flow_run.get_id() or ""),
        }
    )

    init = fetch_init(work, settings["model"]["name"])
    text = prepare_text(domain_text, files, init["folder"], work, int(settings["model"]["max_length"]))
    if not processed:
        ensure_data()
    options = {"steps": steps, "domain_dev": domain_dev, "processed": processed}
    options["teacher_vectors"] = str(work / "teacher")
    base: dict[str, Any] = {
        "method": method,
        "runs": [],
        "text": {k: text[k] for k in ("files", "skipped", "sentences", "truncated")},
        "work_dir": str(work),
        "domain_text_sha256": sha,
        "selected_on": "domain_dev" if domain_dev else "stsb_dev",
    }
    if teacher and not domain_dev:  # no labels: hold out a share before the teacher reads the text
        kept, held = hold_out_file(
            Path(text["path"]), work / "heldout.txt", AgreementConfig.from_params(settings), settings["seed"]
        )
        base["heldout"] = {"sentences": held, "trained_on": kept, "agreement_pairs": 0}
        options["heldout"] = str(work / "heldout.txt") if held else None
        print(f"retrain: no --domain-dev: {held} of {kept + held} sentences held out, never trained on")
    if teacher:
        base["teacher"] = check_teacher(teacher, text["path"], init["folder"], work, env, options, settings)
        if base["teacher"].get("nothing_to_distil"):
            result = {**base, "status": "teacher not better", "registered_version": None}
            return finish(result, files, work, keep=keep or not own_work)
        if base["teacher"].get("agreement"):
            options["agreement"] = str(work / "teacher" / base["teacher"]["agreement"]["file"])
            base["heldout"]["agreement_pairs"] = base["teacher"]["agreement"]["pairs"]
            base["selected_on"] = "teacher_agreement"
    runs, model = [], init["folder"]
    for objective in RETRAIN_METHODS[method]:  # tsdae+contrastive: the second starts from the first's output
        own = {**options, "steps": steps}
        run = transfer(
            settings, model, text["path"], work, f"retrain-{sha[:8]}-{objective}", env, objective, own
        )
        runs.append(run)
        model = run["output"]
    base["runs"] = [
        {k: r.get(k) for k in ("objective", "init", "best_step", "steps", "beat_init", "selected_on")}
        for r in runs
    ]
    init_name = "champion" if init["version"] else "base"
    if not any(r.get("beat_init") for r in runs):
        # The candidate would be the init itself: registering it again teaches the registry nothing.
        print(
            f"retrain: no step of {method} beat its init ({init_name}"
            + (f" version {init['version']}" if init["version"] else "")
            + "): the candidate is the init itself; nothing registered"
        )
        result = {**base, "status": "no gain", "registered_version": None}
    else:
        # The last run that beat its init holds the final weights (a later run that did not returned them).
        winner = [r for r in runs if r.get("beat_init")][-1]
        dev = domain_dev or options.get("agreement")  # the gate compares on what selection read
        gated = register_and_gate(
            settings, init, init_name, winner, work, env, dev, sha, trigger, raw, processed
        )
        result = {**base, **gated}
        result["status"] = "gated"
        print(describe(result))
    return finish(result, files, work, keep=keep or not own_work)


def check_teacher(
    teacher: str,
    texts: str,
    init: str,
    work: Path,
    env: dict[str, str],
    options: dict[str, Any],
    settings: Params,
) -> dict[str, Any]:
    """The teacher's vectors of the text in ``work/teacher``, and teacher against student on the domain dev
    pairs: ``nothing_to_distil`` (the one line said) when the teacher is not better by registry.min_delta."""
    record = teacher_vectors(settings, teacher, texts, init, work, env, options)
    scores = record.get("domain_dev")
    if scores is None:
        print(f"retrain: no --domain-dev pairs: teacher {teacher} is not checked against the student")
        return {"model": teacher, **({"agreement": record["agreement"]} if "agreement" in record else {})}
    line = teacher_not_better(
        teacher, scores["teacher"], scores["student"], GateConfig.from_params(settings).min_delta
    )
    if line:
        print(f"retrain: {line}")
    return {"model": teacher, **scores, "nothing_to_distil": line}


def register_and_gate(
    settings: Params,
    init: dict[str, Any],
    init_name: str,
    last: dict[str, Any],
    work: Path,
    env: dict[str, str],
    domain_dev: str | None,
    sha: str,
    trigger: str,
    raw: str | None = None,
    processed: str | None = None,
) -> dict[str, Any]:
    """Evaluate the retrained model (and the init, unless its registered scores are known), export and gate."""
    stage, retrained = last["stage"], last["output"]
    to_evaluate = {stage: str(retrained)}
    row = init["sts_row"]
    # Re-scored when its registered scores lack a dev guard (a version registered before the gate read it).
    if row is None or not row.get("all") or any(row.get(guard) is None for guard in DEV_GUARDS):
        to_evaluate[init_name] = init["folder"]
    sts = evaluate(settings, to_evaluate, work / "sts.json", env, raw)
    if init_name not in sts:
        sts[init_name] = init["sts_row"]  # the champion's registered scores: same protocol, no re-run
    (work / "candidates.json").write_text(json.dumps(sts, indent=2) + "\n")

    options = {"--sts": work / "candidates.json", "--output": work / "export"}
    options |= {"--model": [f"{stage}={retrained}", f"{init_name}={init['folder']}"]}
    options |= {"--train-metrics": work / "metrics" / "train"}
    options |= {"--tag": [f"domain_text_sha256={sha}", f"trigger={trigger}"]}
    # Static int8 calibrates on what this run trained on (prepare_text wrote it), not on the pipeline's text.
    options |= {"--calibration-text": work / "texts.txt", "--data": raw or RAW}
    options |= {"--processed": processed, "--domain-dev": domain_dev}  # the gate's dev pairs
    if domain_dev and init["version"]:
        options["--champion-candidate"] = f"{init_name}={init['version']}"
    return export_and_gate(settings, options, work / "export.json", env)


def finish(result: dict[str, Any], files: list[Path] | None, work: Path, keep: bool) -> dict[str, Any]:
    """After a successful run: the inbox's files to processed/<date>/, the work folder removed unless kept."""
    result["archived"] = []
    if files is not None:
        date = time.strftime("%Y-%m-%d", time.gmtime())
        result["archived"] = [str(p) for p in archive(files, inbox(), date)]
        print(f"retrain: archived {len(files)} file(s) to {inbox() / 'processed' / date}")
    if keep:
        shutil.rmtree(work / "checkpoints", ignore_errors=True)
        print(f"retrain: work folder kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
        result["work_dir"] = None
    return result


def describe(result: dict[str, Any]) -> str:
    gate = result.get("gate") or {}
    lines = [
        f"retrain: candidate {result.get('checkpoint')} stsb_dev {result.get('stsb_dev', float('nan')):.2f}"
        + (f", domain {result['domain_spearman']:.2f}" if "domain_spearman" in result else "")
        + f", registered version {result.get('registered_version')}",
        f"retrain: gate {gate.get('decision', 'no verdict yet')}; champion is version {gate.get('champion_after')}",
    ]
    lines += [f"  - {r}" for r in gate.get("reasons", [])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Retrain the champion on new domain text and gate it.")
    parser.add_argument(
        "--domain-text",
        help="file (one sentence a line) or folder of them; default the inbox (SENTCL_INBOX or inbox/): its new files",
    )
    parser.add_argument("--domain-dev", help="scored pairs: sentence1<TAB>sentence2<TAB>score")
    parser.add_argument(
        "--work-dir",
        help="a work folder of your own, kept (default: runs/retrain/<time>-<sha8>-<random>, removed unless --keep)",
    )
    parser.add_argument("--steps", type=int, help="override transfer steps (smoke runs)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder after a successful run")
    params_arguments(parser)
    args = parser.parse_args(argv)
    args.domain_text = args.domain_text or str(inbox())
    # Checked here as well as in the flow: bad text or params should not wait for a Prefect server to start.
    try:
        retrain_method(load_params(args.params, args.overrides))
        files = new_files(args.domain_text, inbox())
        if files is not None and not files:
            print(f"retrain: nothing new in {args.domain_text}; nothing registered")
            return 0
        check_retrain_input(args.domain_text, args.domain_dev, files)  # the flow warns, once
    except (DomainTextError, ParamsError) as e:
        print(f"retrain: cannot run: {e}", file=sys.stderr)
        return 2
    try:
        with cli_errors("retrain"):
            check_prefect_api()
            retrain(
                args.domain_text,
                args.domain_dev,
                args.work_dir,
                args.steps,
                keep=args.keep,
                params=args.params,
                overrides=args.overrides,
            )
    except (DomainTextError, ParamsError) as e:
        print(f"retrain: cannot run: {e}", file=sys.stderr)
        return 2
    except SystemExit:
        raise
    except Exception as e:  # the flow's own log has the traceback
        print(f"retrain: failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
