"""A release folder: the chosen checkpoint as a sentence-transformers folder, its ONNX graph and its model card.

The folder is the checkpoint's files plus ``onnx/model.onnx`` (inputs ``input_ids`` and ``attention_mask``
from the folder's tokenizer, output ``sentence_embedding``: the pooled vector), checked against PyTorch to
1e-4, ``README.md`` (the model card, ``templates/model_card.md.j2``) and ``export.json`` (what was exported).
Registration is MLflow's business: ``sentcl_mlflow.registration``.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sentcl.model.quantize import QuantizeConfig
from sentcl.registry.int8 import build_int8
from sentcl.registry.rules import dev_scores, weight_file_digests, weights_fingerprint
from sentcl.training.selection import choose_checkpoint

ONNX_TOLERANCE = 1e-4
CHECK_SENTENCES = [
    "A man is playing a guitar.",
    "Two dogs run through a snowy field.",
    "The stock market fell sharply on Monday after the announcement.",
    "x",
    "A woman slices an onion in a small kitchen while the radio plays an old song about the sea.",
]

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


class OnnxMismatchError(ValueError):
    """The ONNX graph's vectors differ from PyTorch's by more than ``ONNX_TOLERANCE``."""


def best_existing_checkpoint(sts: dict[str, Any], folders: dict[str, Path], max_dev_drop: float) -> str:
    """The checkpoint with the best selection score among those whose folder exists and whose dev guards hold
    (sentcl.training.selection.choose_checkpoint); ``LookupError`` when none does."""
    available = {name for name, folder in folders.items() if folder.exists()}
    return choose_checkpoint(sts, available, max_dev_drop)


def export_onnx(folder: Path, max_length: int) -> dict[str, Any]:
    """``folder/onnx/model.onnx`` with the pooled vector as output, verified against PyTorch."""
    import numpy as np
    import onnxruntime as ort
    import torch

    from sentcl.model.encoder import Encoder

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
        from sentcl.model.prompt import PromptGraph

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
        raise OnnxMismatchError(f"ONNX vectors differ from PyTorch by {diff:.2e} > {ONNX_TOLERANCE:.0e}")
    return report


def seen_rows(sts_row: dict[str, Any], reference: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The card's table of what the checkpoint saw: the seven tasks' pairs split by whether the checkpoint trained
    on both sentences, one or neither (``sentcl.evaluation.seen``), and the unseen-STS pairs, each with the
    reference model's score on the very same pairs; empty when the evaluation did not split."""
    split = sts_row.get("seen_split") or {}
    same = split.get("base_same_pairs") or {}
    rows = []
    for name, label in (("seen", "both sentences trained on"), ("mixed", "one"), ("unseen", "neither")):
        row = (split.get("avg") or {}).get(name) or {}
        if row.get("pairs"):
            base = (same.get(name) or {}).get("spearman")
            rows.append(
                {
                    "label": f"test pairs, {label}",
                    "score": row.get("spearman"),
                    "pairs": row["pairs"],
                    "base": base,
                }
            )
    unseen = sts_row.get("unseen_sts") or {}
    if unseen.get("pairs"):
        base = ((reference or {}).get("unseen_sts") or {}).get("spearman")
        rows.append(
            {
                "label": "unseen STS (no stage read either sentence)",
                "score": unseen.get("spearman"),
                "pairs": unseen["pairs"],
                "base": base,
            }
        )
    return rows


def model_card(
    info: dict[str, Any],
    params: dict[str, Any],
    sts_row: dict[str, Any],
    reference: dict[str, Any] | None = None,
) -> str:
    """README.md of the release folder, rendered from ``templates/model_card.md.j2``."""
    import jinja2
    import yaml

    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("sentcl", "templates"),
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,  # a key the card needs and info lacks is an error, not a blank
        autoescape=False,  # Markdown, not HTML
        trim_blocks=True,  # a line holding only a block tag leaves no line behind
        lstrip_blocks=True,
    )
    tasks = [t for t in (sts_row.get("all") or {}) if t != "avg"] + ["avg"]
    model = params.get("model", {})
    return environment.get_template("model_card.md.j2").render(
        info=info,
        base_model=model.get("name", "unknown"),
        max_length=model.get("max_length"),
        licences=DATA_LICENCES,
        transductive=info["checkpoint"].startswith("transfer"),
        prompt=info["onnx"].get("prompt"),
        tasks=tasks,
        protocols=[(p, sts_row[p]) for p in ("all", "mean") if sts_row.get(p)],
        sick_dev=(info.get("dev_scores") or {}).get("sick_dev"),
        training=info.get("training"),
        seen=seen_rows(sts_row, reference),
        params_yaml=yaml.safe_dump(params, sort_keys=False).strip(),
    )


def build_release(
    checkpoint: str,
    source: Path,
    output: Path,
    sts: dict[str, Any],
    params: dict[str, Any],
    beat_init: bool,
    *,
    model_name: str,
    git_commit: str | None,
    git_dirty: bool,
    quantize_config: QuantizeConfig | None = None,
    data_root: Path | None = None,
    calibration: list[str] | None = None,
    training: dict[str, Any] | None = None,
    reference: str = "base",
) -> dict[str, Any]:
    """Replace ``output`` with ``source``'s files, its ONNX graph, the model card and ``export.json``.
    ``training``: what the checkpoint trained with (``training_record``); ``reference``: the row of ``sts`` the
    card reads the checkpoint's gains against (the pretrained model)."""
    if output.exists():
        shutil.rmtree(output)
    shutil.copytree(source, output, ignore=shutil.ignore_patterns("onnx", "checkpoint-*", "*.pt"))
    info: dict[str, Any] = {
        "model_name": model_name,
        "checkpoint": checkpoint,
        "source": str(source),
        "candidates": list(sts),
        "stsb_dev": float(sts[checkpoint]["stsb_dev"]),
        "sts_all": {k: float(v) for k, v in (sts[checkpoint].get("all") or {}).items()},
        "dev_scores": dev_scores(sts[checkpoint]),  # what the gate guards besides stsb_dev (SICK-R trial)
        "beat_init": beat_init,
        "training": training,
        "weights_sha256": weight_file_digests(output),
        "git_commit": git_commit,
        "git_dirty": git_dirty,
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    info["weights_fingerprint"] = weights_fingerprint(info["weights_sha256"])
    max_length = int(params["model"]["max_length"])
    info["onnx"] = export_onnx(output, max_length)
    if quantize_config is not None and data_root is not None:
        info["int8"] = build_int8(
            output,
            quantize_config,
            sts[checkpoint],
            info["onnx"],
            data_root=data_root,
            max_length=max_length,
            calibration=calibration,
        )
    (output / "README.md").write_text(model_card(info, params, sts[checkpoint], sts.get(reference)))
    (output / "export.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def training_record(checkpoint: str, train_metrics_dir: Path) -> dict[str, Any] | None:
    """What ``checkpoint``'s stage recorded it trained with (``trained`` in its metrics record: objective,
    settings, the teacher); None for the base model or a record without it."""
    path = train_metrics_dir / f"{checkpoint}.json"
    try:
        return json.loads(path.read_text()).get("trained") if path.is_file() else None
    except (OSError, ValueError):
        return None


def beat_init_flags(checkpoint: str, train_metrics_dir: Path) -> tuple[bool, bool]:
    """(the chosen checkpoint is trained and beat its init, any trained checkpoint of this run did)."""
    flags = {}
    for path in sorted(train_metrics_dir.glob("*.json")) if train_metrics_dir.exists() else []:
        try:
            flags[path.stem] = bool(json.loads(path.read_text()).get("beat_init"))
        except (OSError, ValueError):
            continue
    return flags.get(checkpoint, False), any(flags.values())


def domain_spearman(folder: Path, pairs: list[tuple[str, str, float]], max_length: int) -> float:
    """Spearman x 100 of a model on the domain's scored pairs, with the same encoder as the STS evaluation."""
    from sentcl.evaluation.sts import STSEvaluator
    from sentcl.model.encoder import Encoder

    encoder = Encoder.from_pretrained(str(folder), max_length=max_length)
    return STSEvaluator(pairs, name="domain")(encoder.encode)


def release_summary(info: dict[str, Any]) -> dict[str, Any]:
    """metrics/export.json: what the release is, in a few numbers (the folder's export.json has the rest)."""
    summary = {k: info[k] for k in ("checkpoint", "stsb_dev", "beat_init", "trained_beat_init")}
    summary["onnx_max_abs_diff"] = info["onnx"]["max_abs_diff_vs_pytorch"]
    summary["weights_sha256"] = info["weights_fingerprint"]
    if "int8" in info:
        int8 = info["int8"]
        summary["int8"] = {k: int8[k] for k in ("method", "shipped", "file", "max_dev_drop") if k in int8}
        summary["int8"] |= {k: int8[k] for k in ("stsb_dev", "sick_dev", "dev_drops", "reason") if k in int8}
        if "all" in int8:
            summary["int8"]["avg"] = int8["all"]["avg"]
            summary["int8"]["fp32_avg"] = (int8["fp32"].get("all") or {}).get("avg")
    if "domain_spearman" in info["sts_row"]:
        summary["domain_spearman"] = info["sts_row"]["domain_spearman"]
    return summary
