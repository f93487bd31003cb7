"""The HTML report: one self-contained page (images embedded) from metrics/ and plots/, rendered from
``sentcl/templates/report.html.j2``. This module gathers what the page shows; the template says how."""

from __future__ import annotations

import base64
import csv
import io
import json
from pathlib import Path
from typing import Any

from sentcl.evaluation.benchmark import TASKS
from sentcl.training.recipes import checkpoint_settings

TEMPLATES = Path(__file__).resolve().parent / "templates"
TABLE_ROW_LIMIT = 60  # an analysis table longer than this shows its head and says how many rows it left out

# Which analyses to show, and what each plot says (HTML: the template inserts it as is).
ANALYSES = [
    (
        "collapse",
        "Cosine similarity by gold score (collapse)",
        "Each box is the distribution of cosine similarities of STS-B test pairs whose human score falls in the "
        "bucket. A collapsed space (ConSERT Figure 1) gives high cosines to every pair, so boxes overlap; a good "
        "space rises with the gold score. Run: <code>make analysis-space</code>.",
    ),
    (
        "align_uniform",
        "Alignment and uniformity",
        "Wang and Isola's measures on STS-B test: alignment is the mean squared distance of positive pairs "
        "(gold &gt; 4), uniformity the log mean Gaussian potential over all sentences; lower is better for both.",
    ),
    (
        "freq_tokens",
        "Frequent-token removal",
        "Spearman when the k most frequent tokens ([CLS]/[SEP] included) are left out of mean pooling. "
        "Run: <code>make analysis-freq-tokens</code>.",
    ),
    (
        "aug_grid",
        "Augmentation pairs",
        "STS-B test Spearman after a short unsupervised transfer with each pair "
        "of views. Run: <code>make analysis-aug-grid</code>.",
    ),
    ("few_shot", "Few-shot transfer", "STS-B Spearman against the number of target texts used for transfer."),
    ("temperature", "Temperature", "STS-B Spearman against the contrastive temperature."),
    ("batch_size", "Batch size", "STS-B Spearman against the transfer batch size."),
]


def _png_data(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _figure_png(fig) -> str:  # noqa: ANN001 (a matplotlib Figure)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    return _png_data(buffer.getvalue())


def _read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def sts_table(sts: dict[str, Any], protocol: str) -> dict[str, Any]:
    """One protocol's table: the columns, and per checkpoint its cells (value or None, best of its column)."""
    columns = [*TASKS, "avg"]
    best = {
        c: max((row[protocol].get(c, float("-inf")) for row in sts.values()), default=None) for c in columns
    }
    rows = []
    for name, row in sts.items():
        cells = []
        for c in columns:
            value = row[protocol].get(c)
            cells.append({"value": value, "best": value is not None and len(sts) > 1 and value == best[c]})
        rows.append({"name": name, "cells": cells, "dev": row.get("stsb_dev")})
    return {"columns": columns, "rows": rows}


SEEN_SPLITS = ("seen", "unseen", "mixed")  # sentcl.evaluation.seen.SPLITS, as sts.json spells its keys


def seen_split_table(sts: dict[str, Any]) -> dict[str, Any] | None:
    """Per checkpoint, the seven tasks' average Spearman per split (seen / unseen / mixed, with pair counts) and
    its score on the scored STS pairs no stage trained on; None when sts.json predates the split."""
    rows = []
    for name, row in sts.items():
        split, unseen = row.get("seen_split"), row.get("unseen_sts")
        if not split or not unseen:
            return None
        cells = [
            {"value": split["avg"][s]["spearman"], "pairs": split["avg"][s]["pairs"]} for s in SEEN_SPLITS
        ]
        cells.append({"value": unseen.get("spearman"), "pairs": unseen.get("pairs", 0)})
        rows.append({"name": name, "cells": cells})
    first = next(iter(sts.values()), {})
    return {"rows": rows, "unseen_from": (first.get("unseen_sts") or {}).get("from", "")}


def curves_png(curves_dir: Path) -> str | None:
    """Loss and STS-B dev by step of every metrics/curves/*.csv, as one PNG (base64); None when there is none."""
    files = sorted(curves_dir.glob("*.csv")) if curves_dir.is_dir() else []
    if not files:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_ax, dev_ax) = plt.subplots(1, 2, figsize=(12, 4.2))
    for path in files:
        rows = _read_csv(path)
        if not rows:  # a stage not trained on this profile
            continue

        def series(column: str, rows=rows) -> tuple[list[float], list[float]]:
            points = [
                (float(r["step"]), float(r[column])) for r in rows if r.get(column) not in (None, "", "nan")
            ]
            return [p[0] for p in points], [p[1] for p in points]

        loss_ax.plot(*series("loss"), label=path.stem, linewidth=1.2)
        dev_ax.plot(*series("stsb_dev"), marker="o", label=path.stem)
    loss_ax.set(title="Training loss by step", xlabel="optimizer step (count)", ylabel="loss (nats)")
    dev_ax.set(title="STS-B dev Spearman by step", xlabel="optimizer step (count)", ylabel="Spearman x 100")
    for ax in (loss_ax, dev_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out = _figure_png(fig)
    plt.close(fig)
    return out


def _cell_text(value: str) -> str:
    """A CSV cell as the page shows it: a decimal to 2 places, anything else as written."""
    try:
        return f"{float(value):.2f}" if "." in value else value
    except ValueError:
        return value


def csv_table(path: Path, root: Path, limit: int = TABLE_ROW_LIMIT) -> dict[str, Any] | None:
    """An analysis table (its first ``limit`` rows), named by its path under ``root``; None when it is empty."""
    rows = _read_csv(path)
    if not rows:
        return None
    return {
        "path": str(path.relative_to(root)),
        "head": list(rows[0]),
        "rows": [[_cell_text(v) for v in r.values()] for r in rows[:limit]],
        "more": max(0, len(rows) - limit),
    }


def analysis_sections(analysis: Path, plots: Path, root: Path) -> list[dict[str, Any]]:
    """The analyses that have been run (plots/<stem>.png), and always the collapse plot (or that it is missing)."""
    sections = []
    for stem, title, text in ANALYSES:
        png, table = plots / f"{stem}.png", analysis / f"{stem}.csv"
        if stem != "collapse" and not png.exists():
            continue
        image = _png_data(png.read_bytes()) if png.exists() else None
        rows = csv_table(table, root) if image and table.exists() else None
        sections.append({"title": title, "text": text, "name": png.name, "image": image, "table": rows})
    return sections


def _frequent_tokens_summary(path: Path) -> dict[str, Any] | None:
    """metrics/analysis/freq_tokens.json, the model named by its folder's name."""
    summary = _json(path)
    return None if summary is None else summary | {"model_name": Path(summary["model"]).name}


def _training_summary(params: dict[str, Any], checkpoint: str) -> str:
    """The objective (for distillation, the teacher it learned from) and the lr ``checkpoint`` trained with, as
    params.yaml resolves them for its stage (``sentcl.training.recipes``: what the stage itself builds its config from)."""
    settings = checkpoint_settings(params, checkpoint)
    objective = settings.get("objective") or "contrastive"
    if objective == "distill":
        teacher = (params.get("teacher") or {}).get("model")
        distill = settings.get("distill") or {}
        examples = distill.get("examples")
        if examples == "neighbours":
            examples = f"a sentence and its {distill.get('neighbours')} nearest neighbours"
        weight = distill.get("group_weight")
        if examples != "sentences" and weight not in (None, 1):
            examples = f"{examples}, their own similarities weighing {weight:g}"
        objective = f"distill from {teacher} ({distill.get('loss')}, examples {examples})"
    return f"{objective}; lr {settings.get('lr')}"


def stage_lines(records: Path) -> list[str]:
    """Per training stage (metrics/train/<stage>.json), what it did on this profile: trained (steps, whether it
    beat its init) or not trained (steps 0) and why."""
    lines = []
    for path in sorted(records.glob("*.json")) if records.is_dir() else []:
        record = _json(path) or {}
        if record.get("not_trained"):
            lines.append(f"{path.stem}: not trained, {record['not_trained']}")
        else:
            verdict = "beat its init" if record.get("beat_init") else "never beat its init: output = init"
            lines.append(f"{path.stem}: {record.get('steps')} steps, {verdict}")
    return lines


def shipped_facts(metrics: Path, params: dict[str, Any]) -> dict[str, Any]:
    """What the first screen says: the exported checkpoint, the registry version and gate, validation, settings."""
    export, registry = _json(metrics / "export.json"), _json(metrics / "registry.json")
    if not export:
        return {"checkpoint": None}
    name = export["checkpoint"]
    sts = _json(metrics / "sts.json") or {}
    facts: dict[str, Any] = {
        "checkpoint": name,
        "stsb_dev": f"{export['stsb_dev']:.2f}",
        "avg": f"{sts[name]['all']['avg']:.2f}" if name in sts else "?",
        "base_avg": f"{sts['base']['all']['avg']:.2f}" if "base" in sts and name != "base" else None,
        "beat_init": "trained past its init"
        if export.get("trained_beat_init")
        else "no training beat the base",
        "onnx": f"exported and checked against PyTorch (largest difference {export['onnx_max_abs_diff']:.1e})"
        if export.get("onnx_max_abs_diff") is not None
        else "not exported (the model is served by PyTorch)",
    }
    gate = (registry or {}).get("gate") or {}
    version, model = (registry or {}).get("registered_version"), (registry or {}).get("registered_model")
    if not registry:
        facts["registry"] = "not registered yet: the register stage has not run in this clone (make register)"
    elif version is None:
        facts["registry"] = "not registered: tracking was off (SENTCL_MLFLOW=0)"
    else:
        new = "a new version" if registry.get("new_version") else "the same weights as an existing version"
        facts["registry"] = (
            f"version {version} of {model} ({new}); champion: version {gate.get('champion_after') or '-'}"
        )
    decision = gate.get("decision")
    facts["gate_decision"] = {
        "promoted": f"promoted: version {version} is champion",
        "rejected": f"rejected: version {gate.get('champion_after') or '-'} stays champion",
        "unchanged": f"version {version} was already champion",
    }.get(decision, "not run")
    facts["gate_reasons"] = gate.get("reasons") or []
    if decision == "promoted" or (decision == "unchanged" and version is not None):
        facts["verdict"], facts["verdict_class"] = (
            f"{name} shipped: champion is version {version} of {model}.",
            "good",
        )
    elif decision == "rejected":
        facts["verdict"] = (
            f"{name} was registered as version {version}; the gate kept version {gate.get('champion_after')}."
        )
        facts["verdict_class"] = "kept"
    else:
        facts["verdict"], facts["verdict_class"] = (
            f"{name} was exported to models/export; nothing is registered.",
            "",
        )
    validate = _json(metrics / "validate.json")
    facts["validation"] = (
        "not run"
        if validate is None
        else f"passed: {validate['pairs']:,} pairs, no violation"
        if validate.get("violations") == 0
        else f"FAILED: {validate.get('violations')} violations (reports/validation.json)"
    )
    facts["stages"] = stage_lines(metrics / "train")
    record = _json(metrics / "train" / f"{name}.json")
    if name == "base" or record is None:
        facts["training"] = "none: the pretrained model itself (no trained checkpoint beat it on STS-B dev)"
    else:
        bf16 = (params.get("train") or {}).get("bf16")
        precision = record.get("precision") or f"not recorded (train.bf16: {bf16})"
        facts["training"] = (
            f"{record.get('steps')} steps, selected step {record.get('best_step')} "
            f"(STS-B dev {record.get('stsb_dev_step0')} -> {record.get('stsb_dev_best')}); "
            f"{_training_summary(params, name)}; precision {precision}; "
            f"{record.get('examples'):,} examples"
        )
    return facts


def render_report(metrics: Path, plots: Path, params: dict[str, Any], commit: str, root: Path) -> str:
    """The page. ``commit`` names what generated it (not the clock, so the same inputs give the same bytes);
    table paths are shown relative to ``root``."""
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    analysis = metrics / "analysis"
    sts = _json(metrics / "sts.json")
    tables = {} if sts is None else {protocol: sts_table(sts, protocol) for protocol in ("all", "mean")}
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,  # a line holding only a {% tag %} leaves no empty line in the page
    )
    return env.get_template("report.html.j2").render(
        commit=commit or "?",
        shipped=shipped_facts(metrics, params),
        sts=sts,
        pooling=next(iter(sts.values())).get("pooling", "?") if sts else "?",
        tables=tables,
        seen_split=None if sts is None else seen_split_table(sts),
        curves=curves_png(metrics / "curves"),
        analyses=analysis_sections(analysis, plots, root),
        frequent_tokens=_frequent_tokens_summary(analysis / "freq_tokens.json"),
    )
