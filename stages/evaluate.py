"""STS benchmark of model folders: STS12-16, STS-B test, SICK-R test (Spearman x 100, protocols "all" and "mean"),
and the dev splits beside it: STS-B dev (``stsb_dev``) and SICK-R trial (``sick_dev``), which the gate reads.

    python -m stages.evaluate                                   # DVC stage: every checkpoint -> metrics/sts.{json,md}
                                                                #   + metrics/eval/<checkpoint>.json (DVC metrics)
    python -m stages.evaluate --model DIR [--output FILE.json]  # one model: the standalone JSON; logs nothing
    python -m stages.evaluate --model NAME=DIR ... --output F   # several: {NAME: standalone JSON}; logs nothing

``--data`` is a folder in SentEval layout (default: the pipeline's data/raw).

Pooling, per model folder: ``--pooling`` when given, else the pooling the folder carries (``sentcl_pooling.json``,
written for a prompt-trained model), else params ``evaluate.pooling``. ``--pooling prompt`` takes its template,
denoising and final period from params ``evaluate.prompt``; ``--template``/``--denoise``/``--no-denoise`` override
those (also for a folder that carries a prompt).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from sentcl.encoder import resolve_model_path
from sentcl.evaluation import Benchmark, evaluate, load_benchmark, markdown_table, order_result
from sentcl.fast_encode import BACKENDS, DEFAULT_MAX_TOKENS, FastEncoder
from sentcl.model_pooling import POOLINGS, ModelPooling, PromptSettings, read_model_pooling
from stages.common import METRICS, MODELS, RAW, load_params, missing_model, offline_hub

log = logging.getLogger("stages.evaluate")
CHECKPOINTS = ("base", "nli", "joint", "transfer-base", "transfer-nli", "transfer-joint")
DEFAULTS: dict[str, Any] = {
    "pooling": "last-avg",
    "backend": "onnx",
    "max_tokens": DEFAULT_MAX_TOKENS,
    "checkpoints": list(CHECKPOINTS),
}


def evaluate_model(
    model: str | Path,
    benchmark: Benchmark,
    pooling: str = "last-avg",
    backend: str = "onnx",
    max_length: int | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    progress: bool = True,
    prompt: PromptSettings | None = None,
) -> dict[str, Any]:
    """The standalone JSON for one model folder (or the bundled model's name)."""
    encoder = FastEncoder(
        model,
        pooling=pooling,
        max_length=max_length,
        backend=backend,
        max_tokens=max_tokens,
        progress=progress,
        prompt=prompt,
    )
    result = evaluate(benchmark, encoder)
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
            with open(path, "rb") as f:
                for block in iter(lambda f=f: f.read(1 << 20), b""):
                    h.update(block)
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
            raise SystemExit(
                "evaluate: prompt pooling needs a template (params evaluate.prompt or --template)"
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


def _summary(name: str, result: dict[str, Any]) -> str:
    row = result["all"]
    tasks = " ".join(f"{k} {v:.2f}" for k, v in row.items())
    dev, sick = result.get("stsb_dev"), result.get("sick_dev")
    dev_text = f"STS-B dev {dev:.2f}" if dev is not None else "no STS-B dev"
    dev_text += f", SICK-R trial {sick:.2f}" if sick is not None else ""
    return f"{name}: {tasks} | {dev_text} ({result['seconds']:.0f} s, {result['backend']})"


def _parse_models(values: list[str]) -> tuple[dict[str, str], bool]:
    """NAME=DIR pairs, or one plain DIR (then the output is that model's JSON, not a mapping)."""
    if len(values) == 1 and ("=" not in values[0] or Path(values[0]).is_dir()):
        return {values[0]: values[0]}, False
    models = {}
    for value in values:
        name, sep, folder = value.partition("=")
        if not sep:
            raise SystemExit(f"evaluate: several models need NAME=DIR each, got {value!r}")
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


def run_pipeline(
    params: dict[str, Any],
    data: Path,
    pooling: str | None,
    backend: str | None,
    prompt_flags: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The DVC stage: every checkpoint under models/ -> metrics/sts.json + metrics/sts.md, logged as one run.
    Each checkpoint is scored with its own pooling (``model_pooling``) unless ``pooling`` is given."""
    from sentcl_mlflow.runs import log_stage, sts_metrics

    settings = DEFAULTS | (params.get("evaluate") or {})
    poolings = {
        name: model_pooling(MODELS / name, settings, pooling, prompt_flags)
        for name in settings["checkpoints"]
    }
    pooling = pooling or settings["pooling"]
    own = sorted(name for name, chosen in poolings.items() if chosen.pooling != pooling)
    pooling_text = f"{pooling}" + (
        f" (its own for {', '.join(own)}: see `pooling` in sts.json)" if own else ""
    )
    backend = backend or settings["backend"]
    folders = {name: MODELS / name for name in settings["checkpoints"]}
    missing = [name for name, folder in folders.items() if not folder.is_dir()]
    if missing:
        raise SystemExit(
            f"evaluate: missing checkpoints {missing}; run the training stages first (dvc repro)"
        )
    benchmark = load_benchmark(data)
    results: dict[str, Any] = {}
    seen: dict[str, str] = {}
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
                max_tokens=int(settings["max_tokens"]),
                prompt=chosen.prompt,
            )
            results[name]["model"] = f"models/{name}"
            seen[digest] = name
        log.info(_summary(name, results[name]))
    METRICS.mkdir(parents=True, exist_ok=True)
    (METRICS / "sts.json").write_text(json.dumps(results, indent=2) + "\n")
    write_summaries(results, METRICS / "eval")
    table = (
        f"# STS benchmark by checkpoint\n\nSpearman x 100 of cosine similarity, pooling `{pooling_text}`, "
        'protocol "all" (each task\'s subsets concatenated; ConSERT Table 3).\n\n'
        + markdown_table(results, "all")
        + '\nProtocol "mean" (average of per-subset Spearman; SentEval default):\n\n'
        + markdown_table(results, "mean")
    )
    (METRICS / "sts.md").write_text(table)
    metrics = {f"{name}.{k}": v for name, row in results.items() for k, v in sts_metrics(row).items()}
    log_stage(
        "evaluate",
        {"evaluate": settings | {"pooling": pooling, "backend": backend}},
        metrics,
        inputs=[data, *folders.values()],
        artifacts=[METRICS / "sts.json", METRICS / "sts.md"],
    )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", action="append", default=[], help="DIR, or NAME=DIR (repeatable)")
    parser.add_argument("--data", type=Path, default=RAW, help="SentEval layout folder (default data/raw)")
    parser.add_argument("--output", type=Path, help="JSON file (standalone mode; default: stdout)")
    parser.add_argument(
        "--pooling",
        choices=POOLINGS,
        help="for every model; default: the folder's own (sentcl_pooling.json), else params evaluate.pooling",
    )
    parser.add_argument(
        "--template", help="prompt pooling's template, e.g. 'This sentence : \"[X]\" means [MASK] .'"
    )
    parser.add_argument(
        "--denoise",
        action=argparse.BooleanOptionalAction,
        help="prompt pooling: subtract the template's delta (default params evaluate.prompt.denoise)",
    )
    parser.add_argument("--backend", choices=BACKENDS, help="onnx (default) or torch; same numbers")
    parser.add_argument("--max-length", type=int, help="truncation; default the model's own max_seq_length")
    parser.add_argument(
        "--no-dev",
        action="store_true",
        help="skip the dev splits (stsb_dev, sick_dev: null): the seven test tasks only",
    )
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    offline_hub()
    prompt_flags = {"template": args.template, "denoise": args.denoise}
    if not (args.data / "STS").is_dir():
        raise SystemExit(f"evaluate: {args.data} is not in SentEval layout (no STS/ folder)")
    params = load_params()
    if not args.model:
        if args.output:
            raise SystemExit("evaluate: --output is for --model; the stage writes metrics/sts.json")
        run_pipeline(params, args.data, args.pooling, args.backend, prompt_flags)
        return 0

    settings = DEFAULTS | (params.get("evaluate") or {})
    models, as_mapping = _parse_models(args.model)
    for folder in models.values():
        problem = not_a_model_folder(folder) or missing_model(resolve_model_path(folder))
        if problem:
            print(f"evaluate: --model {problem}", file=sys.stderr)
            return 2
    benchmark = load_benchmark(args.data, with_dev=not args.no_dev)
    results: dict[str, Any] = {}
    for name, folder in models.items():
        if not Path(resolve_model_path(folder)).exists() and not Path(folder).exists():
            log.warning("evaluate: %s is not a local folder; trying it as a Hugging Face id", folder)
        chosen = model_pooling(folder, settings, args.pooling, prompt_flags)
        results[name] = evaluate_model(
            folder,
            benchmark,
            chosen.pooling,
            args.backend or settings["backend"],
            max_length=args.max_length,
            max_tokens=int(settings["max_tokens"]),
            progress=not args.no_progress,
            prompt=chosen.prompt,
        )
        log.info(_summary(name, results[name]))
    output = results if as_mapping else next(iter(results.values()))
    text = json.dumps(output, indent=2) + "\n"
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    from sentcl_mlflow.errors import run_main  # MLflow died or hung while logging: one line, exit 75

    raise SystemExit(run_main("evaluate", main))
