"""Stage `export`: the best checkpoint by STS-B dev becomes a release folder, an MLflow model and a challenger.

    python -m stages.export                       # DVC stage: metrics/sts.json + models/<checkpoint>
    python -m stages.export --sts FILE --model NAME=DIR ... --output DIR   # the retrain flow's candidates

The init counts as a candidate (``base``, or the champion's weights in a retrain), so a run whose training
did not help registers its init again, tagged ``beat_init=false``; only the gate moves ``champion``.

The release folder is a sentence-transformers folder plus ``onnx/model.onnx`` (inputs ``input_ids`` and
``attention_mask`` from the folder's tokenizer, output ``sentence_embedding``: the pooled vector), checked
against PyTorch to 1e-4, and a model card (README.md) with data licences, params, the STS table, the weights'
sha256 and the git commit.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
import sys
import time
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sentcl.registry import (
    TAG_DEV,
    TAG_DOMAIN,
    GateConfig,
    choose_checkpoint,
    dev_scores,
    selection_score,  # noqa: F401 (re-exported: analyses and tests rank candidates the same way)
    weight_file_digests,
    weights_fingerprint,
)
from stages.common import EXIT_BAD_INPUT, EXIT_TRANSIENT, METRICS, MODELS, load_params, offline_hub

OUTPUT = MODELS / "export"
ONNX_TOLERANCE = 1e-4
CHECK_SENTENCES = [
    "A man is playing a guitar.",
    "Two dogs run through a snowy field.",
    "The stock market fell sharply on Monday after the announcement.",
    "x",
    "A woman slices an onion in a small kitchen while the radio plays an old song about the sea.",
]
INPUT_EXAMPLE = ["a sentence", "another one"]

# Licences of what the pipeline trains and evaluates on; the card lists them for every export.
DATA_LICENCES = [
    ("all-MiniLM-L6-v2 (base model)", "Apache-2.0", "sentence-transformers; pretrained on 1B sentence pairs"),
    ("SNLI", "CC BY-SA 4.0", "NLI pre-training (pretrain_nli, joint)"),
    (
        "MultiNLI",
        "mostly OANC / CC BY 3.0 (see the corpus description)",
        "NLI pre-training when data.full_nli",
    ),
    (
        "STS 2012-2016 (SemEval)",
        "per-source terms; research use",
        "unlabeled sentences for transfer; evaluation",
    ),
    (
        "STS Benchmark",
        "per-source terms (see the STS wiki)",
        "unlabeled sentences for transfer; dev for selection",
    ),
    ("SICK", "CC BY-NC-SA 3.0: NON-COMMERCIAL", "unlabeled sentences for transfer; SICK-R evaluation"),
]


def weights_sha256(folder: Path) -> dict[str, str]:
    return weight_file_digests(folder)


def choose(sts: dict[str, Any], folders: dict[str, Path]) -> str:
    """The checkpoint with the best selection score among those whose folder exists (sentcl.registry)."""
    try:
        return choose_checkpoint(sts, {name for name, folder in folders.items() if folder.exists()})
    except LookupError as e:
        raise SystemExit(f"export: {e}") from None


def export_onnx(folder: Path, max_length: int) -> dict[str, Any]:
    """``folder/onnx/model.onnx`` with the pooled vector as output, verified against PyTorch."""
    import numpy as np
    import onnxruntime as ort
    import torch

    from sentcl.encoder import Encoder

    encoder = Encoder.from_pretrained(str(folder), max_length=max_length).eval()  # the folder's own pooling

    class Pooled(torch.nn.Module):
        def __init__(self, inner: Encoder) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.inner(input_ids, attention_mask)

    class Normalized(torch.nn.Module):  # a folder that ends in Normalize: unit vectors, as encode gives
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.normalize(
                self.inner(input_ids, attention_mask), p=2, dim=-1, eps=1e-12
            )

    if encoder.pooling == "prompt":
        from sentcl.prompt import PromptGraph

        # [MASK] gather + per-length delta table in the graph; inputs are the prompt-tokenized sentence
        graph = PromptGraph(encoder.model, encoder.prompt_pooler()).eval()
    else:
        graph = Pooled(encoder).eval()
    if encoder.normalize:
        graph = Normalized(graph).eval()

    target = folder / "onnx" / "model.onnx"
    target.parent.mkdir(parents=True, exist_ok=True)
    batch = encoder.tokenize(CHECK_SENTENCES[:2])
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("sequence")}
    started = time.time()
    # The exporter's registry lists torchvision's ops and warns, for each, that torchvision is not installed;
    # this model uses none of them.
    logging.getLogger("torch.onnx._internal.exporter._registration").addFilter(
        lambda record: "torchvision is not installed" not in record.getMessage()
    )
    # torch's exporter warns, on every export, about its own internals (pytree's LeafSpec) and that the two
    # dynamic axes share a constraint: nothing a user can act on, and verified against PyTorch below.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*LeafSpec.*", category=FutureWarning)
        warnings.filterwarnings(
            "ignore", message=r".*The axis name: .* will not be used", category=UserWarning
        )
        torch.onnx.export(
            graph,
            (batch["input_ids"], batch["attention_mask"]),
            str(target),
            input_names=["input_ids", "attention_mask"],
            output_names=["sentence_embedding"],
            dynamic_shapes={"input_ids": dims, "attention_mask": dims},
            dynamo=True,
            external_data=False,
            verbose=False,
        )
    session = ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])
    tokens = encoder.tokenize(CHECK_SENTENCES)
    onnx_vectors = session.run(
        None,
        {"input_ids": tokens["input_ids"].numpy(), "attention_mask": tokens["attention_mask"].numpy()},
    )[0]
    torch_vectors = encoder.encode(CHECK_SENTENCES)
    diff = float(np.abs(onnx_vectors - torch_vectors).max())
    report = {
        "file": "onnx/model.onnx",
        "inputs": ["input_ids", "attention_mask"],
        "output": "sentence_embedding",
        "pooling": encoder.pooling,
        "normalized": encoder.normalize,
        **({"prompt": asdict(encoder.prompt)} if encoder.pooling == "prompt" else {}),
        "max_abs_diff_vs_pytorch": diff,
        "tolerance": ONNX_TOLERANCE,
        "sentences_checked": len(CHECK_SENTENCES),
        "export_seconds": round(time.time() - started, 1),
    }
    (target.parent / "verification.json").write_text(json.dumps(report, indent=2) + "\n")
    if not diff <= ONNX_TOLERANCE:
        raise SystemExit(f"export: ONNX vectors differ from PyTorch by {diff:.2e} > {ONNX_TOLERANCE:.0e}")
    return report


def _table(sts_row: dict[str, Any]) -> str:
    tasks = [t for t in (sts_row.get("all") or {}) if t != "avg"] + ["avg"]
    lines = ["| protocol | " + " | ".join(tasks) + " |", "|---" * (len(tasks) + 1) + "|"]
    for protocol in ("all", "mean"):
        row = sts_row.get(protocol) or {}
        if row:
            cells = [f"{row[t]:.2f}" if isinstance(row.get(t), int | float) else "-" for t in tasks]
            lines.append(f"| {protocol} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _dev_line(info: dict[str, Any]) -> str:
    sick = (info.get("dev_scores") or {}).get("sick_dev")
    return "" if sick is None else f"; SICK-R trial: {sick:.2f}"


def _prompt_note(onnx_report: dict[str, Any]) -> str:
    prompt = onnx_report.get("prompt")
    if not prompt:
        return ""
    return f"""
**This model is pooled with a prompt (PromptBERT)**, recorded in `sentcl_pooling.json`: a sentence is put in
the template `{prompt["template"]}` and its vector is the last-layer state at `[MASK]`
{"minus the template's own [MASK] state at that sentence length (denoising)" if prompt["denoise"] else "(no denoising)"}.
`SentenceTransformer(folder)` alone would mean-pool: use `sentcl.encoder.Encoder.from_pretrained(folder)` or the
registered MLflow model. The ONNX graph expects the sentence already inside the template (tokens
`[CLS] prefix sentence suffix [SEP]`, `sentcl.prompt.tokenize_prompt`).
"""


def model_card(info: dict[str, Any], params: dict[str, Any], sts_row: dict[str, Any]) -> str:
    import yaml

    licences = "\n".join(f"| {name} | {licence} | {use} |" for name, licence, use in DATA_LICENCES)
    weights = "\n".join(f"- `{name}`: `{digest}`" for name, digest in info["weights_sha256"].items())
    transductive = info["checkpoint"].startswith("transfer")
    return f"""---
library_name: sentence-transformers
pipeline_tag: sentence-similarity
base_model: {params.get("model", {}).get("name", "unknown")}
license: other
tags: [sentence-transformers, sentence-similarity, contrastive-learning, sentcl]
---

# {info["model_name"]}: checkpoint `{info["checkpoint"]}`

Sentence encoder fine-tuned contrastively by the sentcl pipeline. Chosen as the checkpoint with the best
STS-B dev Spearman ({info["stsb_dev"]:.2f}) among: {", ".join(info["candidates"])}.
Trained checkpoint beat its init: **{str(info["beat_init"]).lower()}**.

- Base model: `{params.get("model", {}).get("name", "unknown")}` (max_length {params.get("model", {}).get("max_length")})
- Git commit: `{info["git_commit"] or "unknown"}`{" (with uncommitted changes)" if info.get("git_dirty") else ""}
- Exported: {info["exported_at"]}

## Use

```python
from sentence_transformers import SentenceTransformer
model = SentenceTransformer("path/to/this/folder")
vectors = model.encode(["a sentence", "another one"])   # mean pooling, not normalised
```

`onnx/model.onnx` takes `input_ids` and `attention_mask` from this folder's tokenizer and returns the pooled
`sentence_embedding`; it matches PyTorch to {info["onnx"]["max_abs_diff_vs_pytorch"]:.1e} (tolerance 1e-4).
{_prompt_note(info["onnx"])}
## Training data and licences

| data | licence | used for |
|---|---|---|
{licences}

**SICK is licensed for non-commercial use only** (CC BY-NC-SA 3.0). A model trained on its sentences inherits
that restriction unless you retrain without them.

**The default `transfer` stage trains on the unlabeled sentences of the STS test sets** (STS12-16, STS-B, SICK-R;
sentences only, never the scores), as in the ConSERT paper's unsupervised transfer setting.
{"This checkpoint is such a transfer checkpoint: its STS test scores below are transductive, not a held-out estimate." if transductive else "This checkpoint's own (last) training stage did not use STS test sentences; an init it started from may have."}

## STS results (Spearman x 100)

{_table(sts_row)}

STS-B dev: {info["stsb_dev"]:.2f}{_dev_line(info)}

## Weights (sha256)

{weights}

## Parameters (params.yaml)

```yaml
{yaml.safe_dump(params, sort_keys=False).strip()}
```
"""


def build_release(
    checkpoint: str,
    source: Path,
    output: Path,
    sts: dict[str, Any],
    params: dict[str, Any],
    beat_init: bool,
) -> dict[str, Any]:
    from sentcl_mlflow import registry, store

    if output.exists():
        shutil.rmtree(output)
    shutil.copytree(source, output, ignore=shutil.ignore_patterns("onnx", "checkpoint-*", "*.pt"))
    config = GateConfig.from_params(params)
    info: dict[str, Any] = {
        "model_name": registry.target_model_name(config),
        "checkpoint": checkpoint,
        "source": str(source),
        "candidates": list(sts),
        "stsb_dev": float(sts[checkpoint]["stsb_dev"]),
        "sts_all": {k: float(v) for k, v in (sts[checkpoint].get("all") or {}).items()},
        "dev_scores": dev_scores(sts[checkpoint]),  # what the gate guards besides stsb_dev (SICK-R trial)
        "beat_init": beat_init,
        "weights_sha256": weights_sha256(output),
        "git_commit": store.git_commit(),
        "git_dirty": store.git_dirty(),
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    info["weights_fingerprint"] = weights_fingerprint(info["weights_sha256"])
    info["onnx"] = export_onnx(output, int(params["model"]["max_length"]))
    (output / "README.md").write_text(model_card(info, params, sts[checkpoint]))
    (output / "export.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def _beat_init(checkpoint: str, train_metrics_dir: Path) -> tuple[bool, bool]:
    """(the chosen checkpoint is trained and beat its init, any trained checkpoint of this run did)."""
    flags = {}
    for path in sorted(train_metrics_dir.glob("*.json")) if train_metrics_dir.exists() else []:
        try:
            flags[path.stem] = bool(json.loads(path.read_text()).get("beat_init"))
        except (OSError, ValueError):
            continue
    return flags.get(checkpoint, False), any(flags.values())


def log_and_register(
    output: Path,
    info: dict[str, Any],
    params: dict[str, Any],
    sts_row: dict[str, Any],
    inputs: list[Path],
    tags: dict[str, str],
    gate: bool,
    domain: dict[str, Any] | None = None,
    actor: str | None = None,
) -> dict[str, Any]:
    """Register the folder as ``challenger`` and run the gate, as one unit under the promotion lease.

    The MLflow run `export` (the folder as a pyfunc model) is logged only when no version of the model holds
    these weights yet (same sha256): the same weights are never registered twice, whoever retries.
    """
    from sentcl.encoder import load_folder_encoder
    from sentcl_mlflow import registry, runs

    timings: dict[str, float] = {}

    def log_model() -> tuple[str, str]:
        started = time.time()
        example_vectors = load_folder_encoder(output, device="cpu").encode(INPUT_EXAMPLE)  # its own pooling
        metrics = runs.sts_metrics(sts_row)
        metrics["onnx_max_abs_diff"] = info["onnx"]["max_abs_diff_vs_pytorch"]
        run_id, model_uri = runs.log_pyfunc_run(
            "export",
            params,
            metrics,
            model_file=Path(__file__).with_name("pyfunc_encoder.py"),
            artifacts={"encoder": output},
            input_example=INPUT_EXAMPLE,
            example_output=example_vectors,
            pip_requirements=_pip_requirements(),
            inputs=inputs,
            tags={**tags, "checkpoint": info["checkpoint"], "beat_init": str(info["beat_init"]).lower()},
            experiment=registry.run_experiment(info["model_name"], GateConfig.from_params(params)),
        )
        timings["seconds_log_model"] = round(time.time() - started, 2)
        return model_uri, run_id

    started = time.time()
    outcome = registry.register_and_gate(
        log_model,
        info["stsb_dev"],
        info["sts_all"],
        name=info["model_name"],
        tags={
            "checkpoint": info["checkpoint"],
            "beat_init": str(info["beat_init"]).lower(),
            "trained_beat_init": str(info.get("trained_beat_init", False)).lower(),
            "weights_sha256": json.dumps(info["weights_sha256"]),
            TAG_DEV: json.dumps(info.get("dev_scores") or {}, sort_keys=True),
            **(
                {TAG_DOMAIN: f"{sts_row['domain_spearman']:.6f}"}
                if sts_row.get("domain_spearman") is not None
                else {}
            ),
            **{k: v for k, v in tags.items() if not k.startswith("mlflow.")},
        },
        weights_sha256=info["weights_fingerprint"],
        gate=gate,
        actor=actor,
        params=params,
        domain=domain,
    )
    result: dict[str, Any] = {
        **outcome,
        **timings,
        "seconds_register_and_gate": round(time.time() - started - timings.get("seconds_log_model", 0), 2),
    }
    verb = "registered" if outcome["created"] else "found"
    print(
        f"export: {verb} {info['model_name']} version {outcome['version']} as challenger "
        f"({info['checkpoint']}); register+gate {result['seconds_register_and_gate']}s"
    )
    return result


def _pip_requirements() -> list[str]:
    """Pinned from this environment; MLflow's inference would load the model again just to find imports."""
    from importlib.metadata import version

    return [
        f"{name}=={version(name)}"
        for name in ("mlflow", "sentence-transformers", "transformers", "torch", "numpy", "pandas")
    ]


def domain_spearman(folder: Path, pairs: list[tuple[str, str, float]], max_length: int) -> float:
    """Spearman x 100 of a model on the domain's scored pairs, with the same encoder as the STS evaluation."""
    from sentcl.encoder import Encoder
    from sentcl.sts import STSEvaluator

    encoder = Encoder.from_pretrained(str(folder), max_length=max_length)
    return STSEvaluator(pairs, name="domain")(encoder.encode)


def _parse_models(values: list[str]) -> dict[str, Path]:
    folders: dict[str, Path] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep:
            raise SystemExit(f"export: --model expects NAME=DIR, got {value!r}")
        folders[name] = Path(path)
    return folders


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sts", type=Path, default=METRICS / "sts.json", help="STS table by checkpoint")
    parser.add_argument("--model", action="append", default=[], help="NAME=DIR; default models/<NAME>")
    parser.add_argument("--train-metrics", type=Path, default=METRICS / "train")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    parser.add_argument("--summary", type=Path, default=METRICS / "export.json")
    parser.add_argument("--tag", action="append", default=[], help="KEY=VALUE on the run and the version")
    parser.add_argument("--no-register", action="store_true", help="write the folder only")
    parser.add_argument(
        "--no-gate", action="store_true", help="register the challenger, leave champion alone"
    )
    parser.add_argument(
        "--domain-dev", type=Path, help="scored pairs (s1<TAB>s2<TAB>score) of the new domain"
    )
    parser.add_argument(
        "--champion-candidate",
        help="NAME=VERSION: this candidate holds the champion's weights (version VERSION); its domain score "
        "is the champion's in the gate",
    )
    parser.add_argument("--by", help="who runs the gate (default: $SENTCL_ACTOR or the login name)")
    args = parser.parse_args(argv)
    offline_hub()

    from sentcl.domain import DomainTextError, read_scored_pairs
    from sentcl_mlflow import store

    params = load_params()
    GateConfig.from_params(params)  # a wrong registry section stops the stage before any work
    register = not args.no_register and store.tracking_enabled()
    if register:
        store.client()  # an unreachable tracking server fails the stage now, not after the ONNX export
    sts = json.loads(args.sts.read_text())
    folders = {name: MODELS / name for name in sts} | _parse_models(args.model)
    domain: dict[str, Any] | None = None
    tags = dict(value.partition("=")[::2] for value in args.tag)
    if args.domain_dev:
        try:
            pairs = read_scored_pairs(args.domain_dev)
        except DomainTextError as e:
            raise BadInput(f"--domain-dev: {e}") from None
        max_length = int(params["model"]["max_length"])
        for name, row in sts.items():
            if folders.get(name, Path("/-")).exists():
                row["domain_spearman"] = domain_spearman(folders[name], pairs, max_length)
                print(f"export: {name} domain Spearman {row['domain_spearman']:.2f} on {len(pairs)} pairs")
        tags["domain_dev_sha256"] = hashlib.sha256(args.domain_dev.read_bytes()).hexdigest()
    checkpoint = choose(sts, folders)
    if args.domain_dev and args.champion_candidate:
        champ_name, _, champ_version = args.champion_candidate.partition("=")
        domain = {
            "challenger": sts[checkpoint]["domain_spearman"],
            "champion": sts[champ_name]["domain_spearman"],
            "champion_version": champ_version,
        }
    beat_init, any_beat = _beat_init(checkpoint, args.train_metrics)
    info = build_release(checkpoint, folders[checkpoint], args.output, sts, params, beat_init)
    info["trained_beat_init"] = any_beat
    info["sts_row"] = sts[checkpoint]
    (args.output / "export.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"export: {checkpoint} (stsb_dev {info['stsb_dev']:.2f}) -> {args.output}")
    summary = {k: info[k] for k in ("checkpoint", "stsb_dev", "beat_init", "trained_beat_init")}
    summary["onnx_max_abs_diff"] = info["onnx"]["max_abs_diff_vs_pytorch"]
    summary["weights_sha256"] = info["weights_fingerprint"]
    if "domain_spearman" in sts[checkpoint]:
        summary["domain_spearman"] = sts[checkpoint]["domain_spearman"]
    if register:
        inputs = [args.sts, folders[checkpoint]] + ([args.domain_dev] if args.domain_dev else [])
        result = log_and_register(
            args.output, info, params, sts[checkpoint], inputs, tags, not args.no_gate, domain, args.by
        )
        summary.update(registry_summary(result))
    args.summary.parent.mkdir(parents=True, exist_ok=True)
    args.summary.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


def registry_summary(result: dict[str, Any]) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "registered_model": result["model"],
        "registered_version": result["version"],
        "new_version": result["created"],
    }
    if "gate" in result:
        summary["gate"] = {k: result["gate"][k] for k in ("decision", "reasons", "champion_after")}
    return summary


class BadInput(Exception):
    """Input a person must fix: one line, exit 2."""


def run_cli(name: str, main_fn) -> int:  # noqa: ANN001
    """One line and a typed exit code instead of a traceback for what a person or a flow acts on."""
    from sentcl.registry import RegistryConfigError
    from sentcl_mlflow.registry import NoChampionError, PromotionLockTimeout, WeightsMismatchError
    from sentcl_mlflow.store import TrackingAuthError, TrackingUnavailableError

    try:
        return main_fn()
    except (TrackingUnavailableError, PromotionLockTimeout) as e:
        print(f"{name}: {e} (transient: exit {EXIT_TRANSIENT}, try again)", file=sys.stderr)
        return EXIT_TRANSIENT
    except (
        BadInput,
        RegistryConfigError,
        TrackingAuthError,
        NoChampionError,
        WeightsMismatchError,
        FileNotFoundError,
    ) as e:
        print(f"{name}: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as e:  # MLflow died, hung or refused mid-stage: one line, 75 or 2 (sentcl_mlflow.errors)
        from sentcl_mlflow.errors import one_line

        if (known := one_line(name, e)) is None:
            raise
        print(known[1], file=sys.stderr)
        return known[0]


if __name__ == "__main__":
    sys.exit(run_cli("export", main))
