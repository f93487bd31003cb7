"""Retraining on new domain text from the champion: the retrain of ``sentcl.retrain``, then the gate.

    python -m flows.retrain [--domain-text FILE_OR_FOLDER] [--domain-dev PAIRS.tsv] [--keep] [--set KEY=VALUE]

Only Prefect's and MLflow's part lives here: the inbox (``SENTCL_INBOX``), the champion, retried tasks, the gate.
The flow's timeout and its tasks' retries are params.yaml ``flows:`` of the run's params (``--set
flows.retries=0``), read when the run starts."""

from __future__ import annotations

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

from flows import common
from sentcl.data import domain
from sentcl.params import FlowConfig, Params, ParamsError
from sentcl.registry.rules import GateConfig, LeaseTimes
from sentcl.retrain.config import RetrainConfig
from sentcl.retrain.plan import Plan, plan
from sentcl.retrain.run import Outcome, Runner, describe_gate, run, score_candidates
from sentcl.retrain.text import prepare_text
from sentcl_mlflow.store import TrackingConfig, bound_requests
from stages.common import RAW, ROOT, argument_parser, load_params, params_arguments

RUNS = ROOT / "runs" / "retrain"


def inbox() -> Path:
    return Path(os.environ.get("SENTCL_INBOX") or ROOT / "inbox").resolve()


def work_folder(sha: str) -> Path:
    """``runs/retrain/<time>-<sha8>-<random>``: two runs on the same text never share a folder."""
    return RUNS / f"{time.strftime('%Y%m%dT%H%M%S')}-{sha[:8]}-{uuid.uuid4().hex[:8]}"


def say(line: str) -> None:
    print(f"retrain: {line}")


@task(cache_policy=NO_CACHE)
def check_text(domain_text: str, files: list[Path] | None) -> dict[str, Any]:
    """Usable UTF-8 text, at least two distinct sentences; a file that is not UTF-8 text is skipped, said."""
    return domain.read_domain_text(domain_text, files=files, warn=get_run_logger().warning).summary()


@task(cache_policy=NO_CACHE)
def prepare(domain_text: str, files: list[Path] | None, init: str, work: Path, max_tokens: int) -> dict:
    return prepare_text(domain_text, files, init, max_tokens, work / "texts.txt", say)


@common.stage_task()
def fetch_init(work: Path, base_model: str, model_name: str) -> dict[str, Any]:
    """The champion's folder and scores (the base model when none is registered); retried on an MLflow hiccup."""
    from sentcl.model.encoder import resolve_model_path
    from sentcl_mlflow.registry.download import champion_scores, download_model

    shutil.rmtree(work / "champion-download", ignore_errors=True)  # a retry starts from a clean folder
    champion = champion_scores(model_name)
    if champion is None:  # a folder, not a hub id: export copies the candidate it picks, the init among them
        say(f"no champion registered yet; starting from the base model {base_model}")
        return {"version": None, "folder": resolve_model_path(base_model), "sts_row": None}
    version, row = champion
    folder = download_model(f"models:/{model_name}/{version}", work / "champion-download")
    say(f"starting from champion version {version} (stsb_dev {row['stsb_dev']})")
    return {"version": str(version), "folder": str(folder), "sts_row": row}


@common.stage_task()
def stage(command: list[str], env: dict[str, str] | None = None, timeout_s: float = 0) -> None:
    common.run_stage(command, env=env, timeout_s=timeout_s)


@flow(name="sentcl-retrain", log_prints=True)
def run_retrain(
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
    """Retrain on ``domain_text`` (default: the inbox's new files) with ``method`` (default retrain.method),
    ``params`` and ``overrides`` given to every stage; ``processed``/``raw``: other data (no `dvc repro`).
    Its tasks' retries and timeouts are those params' ``flows:``; its own timeout, :func:`configured`'s."""
    from prefect.runtime import flow_run

    domain_text = str(domain_text or inbox())
    # Stages run with the repository as working directory: paths a person typed are made absolute here.
    paths = (domain_dev, params, processed, raw)
    dev, params, processed, raw = (Path(p).resolve() if p else None for p in paths)
    domain.check_inside_inbox(domain_text, trigger, inbox())
    files = domain.new_files(domain_text, inbox(), trigger)
    if files is not None and not files:
        say(f"nothing new in {domain_text} (all of it is in {inbox() / 'processed'}); nothing registered")
        return {"status": "nothing new", "registered_version": None, "archived": []}
    settings = load_params(params, overrides or ())
    flows = FlowConfig.from_params(settings)
    bound_requests(TrackingConfig.from_params(settings))  # the champion's download (params tracking:)
    config = RetrainConfig.from_params(settings, method)  # teacher.model none with a distill method: refused
    checked = check_text(domain_text, files)
    if dev:
        domain.read_scored_pairs(dev)  # a malformed dev set stops the run before training, not after
    sha, work = checked["sha256"], Path(work_dir) if work_dir else work_folder(checked["sha256"])
    work.mkdir(parents=True, exist_ok=bool(work_dir))
    get_run_logger().info("domain text %s (%s): %s", domain_text, config.method, checked)
    tags = {"domain_text_sha256": sha, "trigger": trigger}  # on every run, and on the registered version
    env = {"domain_text": domain_text, "retrain_method": config.method, "flow": "sentcl-retrain"}
    env = common.run_tags_env(tags | env | {"prefect_flow_run_id": str(flow_run.get_id() or "")})
    step_task = common.retried(stage, flows)
    production = GateConfig.from_params(settings).model_name
    init = common.retried(fetch_init, flows)(work, settings["model"]["name"], production)
    text = prepare(domain_text, files, init["folder"], work, int(settings["model"]["max_length"]))
    if not processed:
        # STS-B dev for selection, up to date
        step_task([sys.executable, "-m", "dvc", "repro", "validate"], timeout_s=flows.stage_timeout_s)
    name, steps_by = f"retrain-{sha[:8]}", dict.fromkeys(config.objectives, steps)
    label = f"champion version {init['version']}" if init["version"] else "base"
    todo = plan(
        config, settings, Path(text["path"]), init["folder"], work, name, processed, dev, steps_by, label
    )
    runner = lambda step: step_task.with_options(name=step.name)(step.command, env, flows.stage_timeout_s)  # noqa: E731
    outcome = run(todo, runner, say)
    result = {"method": config.method, "work_dir": str(work), "domain_text_sha256": sha, **outcome.summary()}
    result["text"] = {k: text[k] for k in ("files", "skipped", "sentences", "truncated")}
    if outcome.status != "trained":  # a teacher no better than the student, or no gain: nothing to register
        result |= {"status": outcome.status, "registered_version": None}
    else:
        result |= {**register_and_gate(todo, outcome, init, runner, tags, raw or RAW), "status": "gated"}
        print(describe_gate(result))
    return finish(result, files, work, keep=keep or bool(work_dir))


def configured(settings: Params) -> Any:
    """The retrain flow bounded by ``settings`` (params.yaml ``flows.flow_timeout_s`` with the run's
    overrides): what main() runs, and what the deployments' :func:`retrain` runs once its params are read."""
    return common.bounded(run_retrain, FlowConfig.from_params(settings))


@flow(name="sentcl-retrain", log_prints=True)
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
    """The deployments' entry point (infra/prefect.yaml): the run's params read when it starts, then
    :func:`run_retrain` bounded by them, as this run's subflow."""
    settings = load_params(Path(params).resolve() if params else None, overrides or ())
    options = {"trigger": trigger, "keep": keep, "method": method, "processed": processed, "raw": raw}
    return configured(settings)(
        domain_text, domain_dev, work_dir, steps, params=params, overrides=overrides, **options
    )


def register_and_gate(
    todo: Plan, outcome: Outcome, init: dict, runner: Runner, tags: dict, raw: Path
) -> dict:
    """Evaluate the candidates, export the better and gate it on STS-B dev, SICK-R trial and the gate's domain
    pairs: the domain dev pairs, or without them the held-out gate part's, which selection never read."""
    models = score_candidates(todo, outcome, init, raw, runner)
    export = todo.export_step(models, raw, outcome.gate_pairs)
    runner(export)
    register = todo.register_step(tags, outcome.gate_pairs)
    # One gate at a time on this Prefect server; the stage takes the registry's promotion lease inside it.
    with common.promotion_slot(LeaseTimes.from_params(todo.params).wait_s):
        runner(register)
    return json.loads(export.record.read_text()) | json.loads(register.record.read_text())


def finish(result: dict[str, Any], files: list[Path] | None, work: Path, keep: bool) -> dict[str, Any]:
    """After a successful run: the inbox's files to processed/<date>/, the work folder removed unless kept."""
    date = time.strftime("%Y-%m-%d", time.gmtime())
    result["archived"] = [str(p) for p in domain.archive(files or [], inbox(), date)]
    if files is not None:
        say(f"archived {len(files)} file(s) to {inbox() / 'processed' / date}")
    shutil.rmtree(work / "checkpoints" if keep else work, ignore_errors=True)
    if keep:  # the run's summary beside its files: what selection and the gate read, the gate's verdict
        (work / "retrain.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
        say(f"work folder kept: {work}")
    else:
        result["work_dir"] = None
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser("Retrain the champion on new domain text and gate it.")
    parser.add_argument("--domain-text", default=str(inbox()), help="file or folder (default: the inbox)")
    parser.add_argument("--domain-dev", help="scored pairs: sentence1<TAB>sentence2<TAB>score")
    parser.add_argument("--work-dir", help="a work folder of your own, kept (default: under runs/retrain/)")
    parser.add_argument("--steps", type=int, help="override transfer steps (smoke runs)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder after a successful run")
    params_arguments(parser)
    args = parser.parse_args(argv)
    # Checked here as well as in the flow: bad text or params should not wait for a Prefect server to start.
    try:
        settings = load_params(args.params, args.overrides)
        RetrainConfig.from_params(settings)
        flow_run = configured(settings)  # flows: checked too, and applied
        files = domain.new_files(args.domain_text, inbox())
        if files is not None and not files:
            say(f"nothing new in {args.domain_text}; nothing registered")
            return 0
        domain.check_retrain_input(args.domain_text, args.domain_dev, files)  # the flow warns, once
        with common.cli_errors("retrain"):
            common.check_prefect_api()
            options = {"keep": args.keep, "params": args.params, "overrides": args.overrides}
            flow_run(args.domain_text, args.domain_dev, args.work_dir, args.steps, **options)
    except (domain.DomainTextError, ParamsError) as e:
        print(f"retrain: cannot run: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # the flow's own log has the traceback
        print(f"retrain: failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
