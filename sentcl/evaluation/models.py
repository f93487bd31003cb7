"""Scoring model folders on the STS benchmark: which pooling each folder is scored with, the standalone JSON of one
model, the checkpoints of a pipeline (equal weights scored once), and the files the evaluate stage writes
(sts.json, sts.md, one small DVC metrics file per checkpoint)."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from sentcl.digest import update_from_file
from sentcl.evaluation.benchmark import Benchmark, evaluate, markdown_table, order_result
from sentcl.evaluation.seen import MIN_PAIRS, UNSEEN_DESCRIPTION, split_markdown
from sentcl.model.encoder import resolve_model_path
from sentcl.model.fast_encode import DEFAULT_MAX_TOKENS, FastEncoder
from sentcl.model.pooling import ModelPooling, PromptSettings, read_model_pooling

# The pipeline's checkpoints, and what the evaluate stage uses where params ``evaluate`` says nothing.
CHECKPOINTS = ("base", "nli", "joint", "transfer-base", "transfer-nli", "transfer-joint")
DEFAULTS: dict[str, Any] = {
    "pooling": "last-avg",
    "backend": "onnx",
    "max_tokens": DEFAULT_MAX_TOKENS,
    "checkpoints": list(CHECKPOINTS),
}


def stage_settings(params: dict[str, Any]) -> dict[str, Any]:
    """params ``evaluate`` over ``DEFAULTS``."""
    return DEFAULTS | (params.get("evaluate") or {})


class EvaluationSetupError(ValueError):
    """Settings or flags that name no scoring (the message is the one line the command prints)."""


def evaluate_model(
    model: str | Path,
    benchmark: Benchmark,
    pooling: str = "last-avg",
    backend: str = "onnx",
    max_length: int | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    progress: bool = True,
    prompt: PromptSettings | None = None,
    keep_cosines: bool = False,
) -> dict[str, Any]:
    """The standalone JSON for one model folder (or the bundled model's name); ``keep_cosines``: with the
    pairs' cosines (``benchmark.evaluate``), which the caller pops before writing."""
    encoder = FastEncoder(
        model,
        pooling=pooling,
        max_length=max_length,
        backend=backend,
        max_tokens=max_tokens,
        progress=progress,
        prompt=prompt,
    )
    result = evaluate(benchmark, encoder, keep_cosines)
    if prompt is not None and pooling == "prompt":
        result["prompt"] = asdict(prompt)
    result.update(
        pooling=pooling,
        model=str(model),
        backend=encoder.backend,
        max_length=encoder.max_length,
        unique_sentences=len(benchmark.sentences),
    )
    result.setdefault("stsb_dev", None)  # a benchmark loaded without dev
    result.setdefault("sick_dev", None)
    return order_result(result)


def weights_digest(folder: Path) -> str:
    """sha256 over a model folder's weights, config and tokenizer files (what decides its vectors)."""
    h = hashlib.sha256()
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file() and path.suffix in (".safetensors", ".bin", ".json", ".txt", ".model"):
            if path.name == "README.md":
                continue
            h.update(str(path.relative_to(folder)).encode())
            if path.name == "tokenizer.json":
                h.update(_tokenizer_without_call_state(path))
                continue
            update_from_file(h, path)
    return h.hexdigest()


def _tokenizer_without_call_state(path: Path) -> bytes:
    """tokenizer.json minus ``truncation`` and ``padding``: the state of the last call that saved it (the bundled
    model keeps 128 / fixed, a trained folder 64 / longest), which every encoder here overrides per call (FastEncoder
    truncates to the folder's max_seq_length and pads itself), so it cannot change a vector."""
    spec = json.loads(path.read_text(encoding="utf-8"))
    spec.pop("truncation", None)
    spec.pop("padding", None)
    return json.dumps(spec, sort_keys=True).encode()


def model_pooling(
    folder: str | Path,
    settings: dict[str, Any],
    pooling: str | None = None,
    prompt_flags: dict[str, Any] | None = None,
) -> ModelPooling:
    """The pooling to score ``folder`` with: the ``pooling`` flag, else the folder's own, else params
    ``evaluate.pooling``; prompt settings from params ``evaluate.prompt`` (or the folder's), then the flags."""
    flags = {k: v for k, v in (prompt_flags or {}).items() if v is not None}

    def from_params() -> PromptSettings:
        values = dict(settings.get("prompt") or {}) | flags
        if "template" not in values:
            raise EvaluationSetupError(
                "prompt pooling needs a template (params evaluate.prompt or --template)"
            )
        return PromptSettings(**values)

    if pooling is None:
        path = Path(resolve_model_path(str(folder)))
        carried = read_model_pooling(path) if path.is_dir() else None
        if carried is not None:
            if carried.prompt is not None and flags:
                return ModelPooling(carried.pooling, replace(carried.prompt, **flags))
            return carried
        pooling = settings["pooling"]
    return ModelPooling(pooling, from_params() if pooling == "prompt" else None)


def summary_line(name: str, result: dict[str, Any]) -> str:
    """The one log line of a scored model: its seven tasks, its dev scores, how long it took."""
    row = result["all"]
    tasks = " ".join(f"{k} {v:.2f}" for k, v in row.items())
    dev, sick = result.get("stsb_dev"), result.get("sick_dev")
    dev_text = f"STS-B dev {dev:.2f}" if dev is not None else "no STS-B dev"
    dev_text += f", SICK-R trial {sick:.2f}" if sick is not None else ""
    line = f"{name}: {tasks} | {dev_text} ({result['seconds']:.0f} s, {result['backend']})"
    split, unseen = result.get("seen_split"), result.get("unseen_sts")
    if split and unseen:  # the stage's split by what the checkpoint saw (sentcl.evaluation.seen)
        parts = [f"{s} {_score_text(v['spearman'])} ({v['pairs']} pairs)" for s, v in split["avg"].items()]
        parts.append(f"unseen STS {_score_text(unseen['spearman'])} ({unseen['pairs']} pairs)")
        line += " | " + ", ".join(parts)
    return line


def _score_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def parse_models(values: list[str]) -> tuple[dict[str, str], bool]:
    """NAME=DIR pairs, or one plain DIR (then the output is that model's JSON, not a mapping)."""
    if len(values) == 1 and ("=" not in values[0] or Path(values[0]).is_dir()):
        return {values[0]: values[0]}, False
    models = {}
    for value in values:
        name, sep, folder = value.partition("=")
        if not sep:
            raise EvaluationSetupError(f"several models need NAME=DIR each, got {value!r}")
        models[name] = folder
    return models, True


def not_a_model_folder(model: str | Path) -> str | None:
    """Why an existing path cannot be a model (a file, a folder without config.json / modules.json), or
    None. A path that does not exist may be a Hugging Face id and is left to the loader."""
    path = Path(model)
    if not path.exists():
        return None
    if not path.is_dir():
        return f"{model}: a file, not a model folder"
    if not ((path / "config.json").is_file() or (path / "modules.json").is_file()):
        return f"{model}: not a model folder (no config.json or modules.json in it)"
    return None


def write_summaries(results: dict[str, Any], folder: Path) -> None:
    """The DVC metrics: one small file per checkpoint, {"avg", "stsb_dev", "sick_dev"} to 2 decimals of
    Spearman x 100.

    One file per checkpoint, with the same two keys, because `dvc metrics show` prints one column per distinct
    key: a single file keyed by checkpoint would make twelve. The full tables stay in sts.json (not a metric)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, result in results.items():
        summary = {"avg": round(result["all"]["avg"], 2)}
        for key in ("stsb_dev", "sick_dev"):
            summary[key] = None if result.get(key) is None else round(result[key], 2)
        (folder / f"{name}.json").write_text(json.dumps(summary, indent=2) + "\n")


def checkpoint_poolings(
    folders: dict[str, Path],
    settings: dict[str, Any],
    pooling: str | None,
    prompt_flags: dict[str, Any] | None = None,
) -> dict[str, ModelPooling]:
    """The pooling of each checkpoint folder (``model_pooling``); every folder must be there."""
    poolings = {
        name: model_pooling(folder, settings, pooling, prompt_flags) for name, folder in folders.items()
    }
    missing = [name for name, folder in folders.items() if not folder.is_dir()]
    if missing:
        raise EvaluationSetupError(
            f"missing checkpoints {missing}; run the training stages first (dvc repro)"
        )
    return poolings


def score_checkpoints(
    folders: dict[str, Path],
    poolings: dict[str, ModelPooling],
    benchmark: Benchmark,
    backend: str,
    max_tokens: int,
    on_result: Callable[[str, dict[str, Any]], None],
    more_scores: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Each checkpoint folder scored with its pooling, its ``model`` named ``models/<name>``; ``on_result`` hears
    of each as it is done. ``more_scores(name, cosines)``: keys to add to a checkpoint's row from its pairs'
    cosines (``benchmark.evaluate``'s ``keep_cosines``), e.g. the scores split by what it saw in training."""
    results: dict[str, Any] = {}
    seen: dict[str, str] = {}
    cosines: dict[str, dict[str, Any]] = {}
    for name, folder in folders.items():
        # A stage that never beat its init writes the init unchanged: the same weights score the same, so
        # they are evaluated once (exact, and it saves minutes of `make run` on CPU).
        digest = weights_digest(folder)
        if digest in seen:
            results[name] = dict(results[seen[digest]], model=f"models/{name}", same_weights_as=seen[digest])
            results[name]["seconds"] = 0.0
        else:
            chosen = poolings[name]
            results[name] = evaluate_model(
                folder,
                benchmark,
                chosen.pooling,
                backend,
                max_tokens=max_tokens,
                prompt=chosen.prompt,
                keep_cosines=more_scores is not None,
            )
            cosines[digest] = results[name].pop("cosines", {})
            results[name]["model"] = f"models/{name}"
            seen[digest] = name
        if more_scores is not None:  # per checkpoint, not per weights: two names may differ in what they saw
            results[name].update(more_scores(name, cosines[digest]))
        on_result(name, results[name])
    return results


def score_models(
    models: dict[str, str],
    benchmark: Benchmark,
    settings: dict[str, Any],
    pooling: str | None,
    prompt_flags: dict[str, Any] | None,
    backend: str | None,
    max_length: int | None,
    progress: bool,
    log: logging.Logger,
) -> dict[str, Any]:
    """Each of ``models`` (name -> folder, or a Hugging Face id) scored with its pooling (``model_pooling``), by
    ``backend`` (default ``settings``'), its summary line on ``log``: the standalone JSON of each."""
    backend, max_tokens = backend or settings["backend"], int(settings["max_tokens"])
    results: dict[str, Any] = {}
    for name, folder in models.items():
        if not Path(resolve_model_path(folder)).exists() and not Path(folder).exists():
            log.warning("evaluate: %s is not a local folder; trying it as a Hugging Face id", folder)
        chosen = model_pooling(folder, settings, pooling, prompt_flags)
        results[name] = evaluate_model(
            folder,
            benchmark,
            chosen.pooling,
            backend,
            max_length=max_length,
            max_tokens=max_tokens,
            progress=progress,
            prompt=chosen.prompt,
        )
        log.info(summary_line(name, results[name]))
    return results


def pooling_description(poolings: dict[str, ModelPooling], pooling: str) -> str:
    """``pooling``, and which checkpoints were scored with their own instead."""
    own = sorted(name for name, chosen in poolings.items() if chosen.pooling != pooling)
    return f"{pooling}" + (f" (its own for {', '.join(own)}: see `pooling` in sts.json)" if own else "")


def write_sts_outputs(results: dict[str, Any], folder: Path, pooling_text: str) -> list[Path]:
    """sts.json (every table), sts.md (both protocols) and eval/<checkpoint>.json under ``folder``; returns the
    first two (the run's artifacts)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sts.json").write_text(json.dumps(results, indent=2) + "\n")
    write_summaries(results, folder / "eval")
    table = (
        f"# STS benchmark by checkpoint\n\nSpearman x 100 of cosine similarity, pooling `{pooling_text}`, "
        'protocol "all" (each task\'s subsets concatenated; ConSERT Table 3).\n\n'
        + markdown_table(results, "all")
        + '\nProtocol "mean" (average of per-subset Spearman; SentEval default):\n\n'
        + markdown_table(results, "mean")
    )
    splits = split_markdown(results)
    if splits:
        table += (
            "\n## By what the checkpoint saw in training\n\n"
            "Spearman x 100 (pairs) of the seven test tasks' pairs split by whether both sentences (seen), neither "
            "(unseen) or one (mixed) are in the text the checkpoint's training stages trained on; averages over "
            f"the tasks with at least {MIN_PAIRS} pairs in the split; beside a score, the base model's average over "
            "the same pairs and the gain. Unseen STS: "
            f"{UNSEEN_DESCRIPTION}.\n\n" + splits
        )
    (folder / "sts.md").write_text(table)
    return [folder / "sts.json", folder / "sts.md"]
