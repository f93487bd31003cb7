"""Retraining on new domain text, from the current champion: validate, transfer, evaluate, register, gate.

    python -m flows.retrain --domain-text FILE_OR_FOLDER [--domain-dev PAIRS.tsv]

Exit code 0 when the flow ran (promoted or not: the gate's decision is printed with its numbers); non-zero
when it could not run (bad text: 2, anything else: 1). Deployments run the same flow on a cron schedule and
when the inbox watcher (flows/watch.py) reports new files (infra/prefect.yaml).

Every step is a stage run as a subprocess (stages.transfer, stages.evaluate, stages.export) so that the
flow adds orchestration only. Work files go to ``runs/retrain/<time>-<sha8>/``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.common import (
    check_prefect_api,
    cli_errors,
    flow_config,
    promotion_slot,
    retry_if_transient,
    run_stage,
    run_tags_env,
)
from sentcl.domain import DomainTextError, read_domain_text, read_scored_pairs, write_sentences
from stages.common import PROCESSED, ROOT, load_params

RUNS = ROOT / "runs" / "retrain"
PY = sys.executable
SETTINGS = flow_config()
# Runs started by an event or a schedule read domain text only from here (the watcher's folder).
TRIGGERED = ("event", "schedule")


def inbox() -> Path:
    return Path(os.environ.get("SENTCL_INBOX") or ROOT / "inbox").resolve()


def check_inside_inbox(domain_text: str, trigger: str) -> None:
    """An event or schedule names a path; only paths inside the configured inbox are accepted (an event
    payload is data from whoever can emit events, not a licence to read any file the worker can)."""
    if trigger not in TRIGGERED:
        return
    box, path = inbox(), Path(domain_text).resolve()
    if path != box and box not in path.parents:
        raise DomainTextError(
            f"{domain_text}: outside the inbox {box} (SENTCL_INBOX); a {trigger}-triggered retrain reads only there"
        )


@task(cache_policy=NO_CACHE)
def check_text(domain_text: str) -> dict[str, Any]:
    """UTF-8, not binary, not empty, at least two distinct sentences: checked before anything is downloaded."""
    return read_domain_text(domain_text).summary()


@task(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=10, retry_condition_fn=retry_if_transient)
def fetch_init(work: Path) -> dict[str, Any]:
    """The champion's folder and its registered scores; the base model when nothing is registered yet.

    Retried (twice) when MLflow or its artifact store has a hiccup (flows.common.transient_error: the server
    unreachable, a connection reset, MLflow's TEMPORARILY_UNAVAILABLE / INTERNAL_ERROR); a weights mismatch
    or a missing model is not retried."""
    from sentcl_mlflow import registry

    shutil.rmtree(work / "champion-download", ignore_errors=True)  # a retry starts from a clean folder
    champion = registry.champion_scores()
    if champion is None:
        from sentcl.encoder import resolve_model_path

        name = load_params()["model"]["name"]
        print(f"retrain: no champion registered yet; starting from the base model {name}")
        # A folder, not a hub id: export copies the candidate it picks, and the init is a candidate.
        return {"version": None, "folder": resolve_model_path(name), "sts_row": None}
    version, (stsb, table, _) = champion
    folder = registry.download_model(
        f"models:/{registry.gate_config().model_name}/{version}", work / "champion-download"
    )
    print(f"retrain: starting from champion version {version} (stsb_dev {stsb})")
    return {"version": str(version), "folder": str(folder), "sts_row": {"all": table, "stsb_dev": stsb}}


@task(cache_policy=NO_CACHE)
def prepare_text(domain_text: str, init_folder: str, work: Path) -> dict[str, Any]:
    """Deduplicated text for the transfer stage, checked against the init's tokenizer length limit."""
    from sentcl.encoder import resolve_model_path

    max_tokens = int(load_params()["model"]["max_length"])
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(init_folder))
    text = read_domain_text(
        domain_text, lambda s: len(tokenizer(s, add_special_tokens=True)["input_ids"]), max_tokens
    )
    path = write_sentences(text.sentences, work / "texts.txt")
    return {**text.summary(), "path": str(path)}


@task(
    cache_policy=NO_CACHE,
    retries=SETTINGS.retries,
    retry_delay_seconds=SETTINGS.retry_delay_s,
    retry_condition_fn=retry_if_transient,
)
def ensure_data() -> None:
    """The transfer stage scores STS-B dev from data/processed; DVC brings it up to date if needed."""
    run_stage([PY, "-m", "dvc", "repro", "validate"])


@task(
    cache_policy=NO_CACHE,
    retries=SETTINGS.retries,
    retry_delay_seconds=SETTINGS.retry_delay_s,
    retry_condition_fn=retry_if_transient,
)
def transfer(
    init: str, texts: str, work: Path, stage: str, env: dict[str, str], steps: int | None = None
) -> Path:
    output = work / "models" / stage
    run_stage(
        [PY, "-m", "stages.transfer", "--init", init, "--texts", texts, "--output", str(output)]
        + ["--stage", stage, "--metrics-dir", str(work / "metrics")]
        + ["--checkpoints-dir", str(work / "checkpoints"), "--processed", str(PROCESSED)]
        + (["--steps", str(steps)] if steps else []),
        env=env,
    )
    return output


@task(
    cache_policy=NO_CACHE,
    retries=SETTINGS.retries,
    retry_delay_seconds=SETTINGS.retry_delay_s,
    retry_condition_fn=retry_if_transient,
)
def evaluate(models: dict[str, str], output: Path, env: dict[str, str]) -> dict[str, Any]:
    cmd = [PY, "-m", "stages.evaluate", "--output", str(output), "--no-progress"]
    for name, folder in models.items():
        cmd += ["--model", f"{name}={folder}"]
    run_stage(cmd, env=env)
    return json.loads(output.read_text())


@task(
    cache_policy=NO_CACHE,
    retries=SETTINGS.retries,
    retry_delay_seconds=SETTINGS.retry_delay_s,
    retry_condition_fn=retry_if_transient,
)
def export_and_gate(args: list[str], summary: Path, env: dict[str, str]) -> dict[str, Any]:
    # The slot serialises gates across every flow on this Prefect server; the stage adds its file lock.
    with promotion_slot():
        run_stage([PY, "-m", "stages.export", *args, "--summary", str(summary)], env=env)
    return json.loads(summary.read_text())


@flow(name="sentcl-retrain", log_prints=True, timeout_seconds=SETTINGS.flow_timeout_s or None)
def retrain(
    domain_text: str,
    domain_dev: str | None = None,
    work_dir: str | None = None,
    steps: int | None = None,
    trigger: str = "manual",
) -> dict[str, Any]:
    """Transfer the champion to ``domain_text``, register the better of init and result, run the gate."""
    from prefect.runtime import flow_run

    logger = get_run_logger()
    check_inside_inbox(domain_text, trigger)
    checked = check_text(domain_text)
    if domain_dev:
        read_scored_pairs(domain_dev)  # a malformed dev set stops the run before training, not after
    sha = checked["sha256"]
    work = Path(work_dir) if work_dir else RUNS / f"{time.strftime('%Y%m%dT%H%M%S')}-{sha[:8]}"
    work.mkdir(parents=True, exist_ok=True)
    logger.info("domain text %s: %s", domain_text, checked)
    env = run_tags_env(
        {
            "domain_text_sha256": sha,
            "domain_text": str(domain_text),
            "trigger": trigger,
            "flow": "sentcl-retrain",
            "prefect_flow_run_id": str(flow_run.get_id() or ""),
        }
    )

    init = fetch_init(work)
    text = prepare_text(domain_text, init["folder"], work)
    ensure_data()
    stage = f"retrain-{sha[:8]}"
    retrained = transfer(init["folder"], text["path"], work, stage, env, steps)

    init_name = "champion" if init["version"] else "base"
    to_evaluate = {stage: str(retrained)}
    if init["sts_row"] is None or not init["sts_row"].get("all"):
        to_evaluate[init_name] = init["folder"]
    sts = evaluate(to_evaluate, work / "sts.json", env)
    if init_name not in sts:
        sts[init_name] = init["sts_row"]  # the champion's registered scores: same protocol, no re-run
    (work / "candidates.json").write_text(json.dumps(sts, indent=2) + "\n")

    export_args = ["--sts", str(work / "candidates.json"), "--output", str(work / "export")]
    export_args += ["--model", f"{stage}={retrained}", "--model", f"{init_name}={init['folder']}"]
    export_args += ["--train-metrics", str(work / "metrics" / "train")]
    export_args += ["--tag", f"domain_text_sha256={sha}", "--tag", f"trigger={trigger}"]
    if domain_dev:
        export_args += ["--domain-dev", str(domain_dev)]
        if init["version"]:
            export_args += ["--champion-candidate", f"{init_name}={init['version']}"]
    result = export_and_gate(export_args, work / "export.json", env)
    result["work_dir"] = str(work)
    result["domain_text_sha256"] = sha
    print(describe(result))
    shutil.rmtree(work / "checkpoints", ignore_errors=True)
    return result


def describe(result: dict[str, Any]) -> str:
    gate = result.get("gate") or {}
    lines = [
        f"retrain: candidate {result.get('checkpoint')} stsb_dev {result.get('stsb_dev', float('nan')):.2f}"
        + (f", domain {result['domain_spearman']:.2f}" if "domain_spearman" in result else "")
        + f", registered version {result.get('registered_version')}",
        f"retrain: gate {gate.get('decision', 'not run')}; champion is version {gate.get('champion_after')}",
    ]
    lines += [f"  - {r}" for r in gate.get("reasons", [])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Retrain the champion on new domain text and gate it.")
    parser.add_argument("--domain-text", required=True, help="file (one sentence a line) or folder of them")
    parser.add_argument("--domain-dev", help="scored pairs: sentence1<TAB>sentence2<TAB>score")
    parser.add_argument("--work-dir", help="default runs/retrain/<time>-<sha8>")
    parser.add_argument("--steps", type=int, help="override transfer steps (smoke runs)")
    args = parser.parse_args(argv)
    # Checked here as well as in the flow: bad text should not wait for a Prefect server to start.
    try:
        read_domain_text(args.domain_text)
        if args.domain_dev:
            if not Path(args.domain_dev).is_file():
                raise DomainTextError(f"--domain-dev {args.domain_dev}: no such file")
            read_scored_pairs(args.domain_dev)
    except DomainTextError as e:
        print(f"retrain: cannot run: {e}", file=sys.stderr)
        return 2
    try:
        with cli_errors("retrain"):
            check_prefect_api()
            retrain(args.domain_text, args.domain_dev, args.work_dir, args.steps)
    except DomainTextError as e:
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
