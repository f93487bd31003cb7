"""The paper's analyses as runs over model folders (:mod:`sentcl.evaluation.analysis` holds the measures): the space of each
model before and after training, frequent-token removal, and the training sweeps (augmentation pairs, few-shot,
temperature, batch size), each writing its table and its plot."""

from __future__ import annotations

import csv
import json
import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sentcl.evaluation.analysis import pooled_without_frequent, space_stats, token_frequencies
from sentcl.evaluation.analysis_plots import plot_freq_tokens, plot_space, plot_sweep
from sentcl.evaluation.benchmark import load_benchmark, score_vectors
from sentcl.evaluation.models import CHECKPOINTS
from sentcl.model.encoder import resolve_model_path
from sentcl.model.fast_encode import FastEncoder
from sentcl.params import Params, merge, write_params

log = logging.getLogger(__name__)

GRID_VIEWS = ("none", "shuffle", "token_cutoff", "feature_cutoff", "dropout")
SWEEPS: dict[str, tuple[str, list[Any]]] = {
    "few-shot": ("max_texts", [1, 10, 100, 1000, 10000, "all"]),
    "temperature": ("temperature", [0.01, 0.05, 0.1, 0.5, 1.0]),
    "batch-size": ("batch_size", [8, 16, 32, 64, 128]),
}
# Trains one sweep cell: (its params file, the work folder, the cell's name) -> the model in work/<name>, its
# record in work/metrics/train/<name>.json and its curve in work/metrics/curves/<name>.csv.
RunCell = Callable[[Params, Path, str], None]


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def models_before_after(params: dict[str, Any], extra: Sequence[str], models: Path) -> dict[str, str]:
    """The pretrained model ("before") and every trained checkpoint present under ``models`` ("after"), plus
    ``extra`` folders (NAME=DIR or DIR)."""
    found = {f"pretrained ({params['model']['name']})": resolve_model_path(params["model"]["name"])}
    found |= {name: str(models / name) for name in CHECKPOINTS if (models / name).is_dir()}
    for value in extra:
        name, sep, folder = value.partition("=")
        found[name if sep else Path(value).name] = folder if sep else value
    return found


# ------------------------------------------------------------------------------------------------ space


def run_space(
    models: dict[str, str],
    data: Path,
    analysis: Path,
    plots: Path,
    split: str = "test",
    log: logging.Logger = log,
) -> dict[str, Any]:
    """Alignment, uniformity and the cosine by gold bucket of each model (name -> folder) on STS-B ``split``:
    space.json, collapse.csv, align_uniform.csv under ``analysis``, the two plots under ``plots``."""
    benchmark = load_benchmark(data, tasks=("STSb",), with_dev=True)
    subset = benchmark.subsets[0] if split == "test" else benchmark.dev
    sentences = list(dict.fromkeys([*subset.sentences1, *subset.sentences2]))
    index = {s: i for i, s in enumerate(sentences)}
    results, rows = {}, []
    for name, folder in models.items():
        vectors = FastEncoder(folder, backend="torch", progress=True)(sentences)
        a = vectors[[index[s] for s in subset.sentences1]]
        b = vectors[[index[s] for s in subset.sentences2]]
        stats = space_stats(subset, a, b, vectors)
        results[name] = stats
        for label, cell in stats["cosine_by_bucket"].items():
            rows.append({"model": name, "bucket": label, **cell})
        log.info(
            "%s: alignment %.3f uniformity %.3f Spearman %.2f",
            name,
            stats["alignment"],
            stats["uniformity"],
            stats["spearman"],
        )
    summary = {
        name: {k: v for k, v in s.items() if k not in ("cosines", "buckets")} for name, s in results.items()
    }
    analysis.mkdir(parents=True, exist_ok=True)
    (analysis / "space.json").write_text(
        json.dumps({"split": f"STS-B {split}", "models": summary}, indent=2) + "\n"
    )
    write_csv(analysis / "collapse.csv", rows)
    write_csv(
        analysis / "align_uniform.csv",
        [
            {"model": n, "alignment": s["alignment"], "uniformity": s["uniformity"]}
            for n, s in summary.items()
        ],
    )

    plot_space(results, summary, split, plots)
    return summary


# ---------------------------------------------------------------------------------------- frequent tokens


def run_freq_tokens(
    model: str,
    data: Path,
    max_k: int,
    analysis: Path,
    plots: Path,
    label: str | None = None,
    log: logging.Logger = log,
) -> list[dict[str, Any]]:
    """The seven-task Spearman of mean pooling with the k most frequent tokens left out, k = 0..max_k:
    freq_tokens.csv and freq_tokens.json under ``analysis``, the plot under ``plots``."""
    label = label or Path(model).name
    benchmark = load_benchmark(data, with_dev=False)
    encoder = FastEncoder(model, backend="torch")
    sentences = benchmark.sentences
    counts = token_frequencies(encoder, sentences)
    ranked = [token for token, _ in counts.most_common()]
    log.info(
        "%d sentences; most frequent: %s",
        len(sentences),
        encoder.tokenizer.convert_ids_to_tokens(ranked[:12]),
    )
    pooled = pooled_without_frequent(encoder, sentences, ranked, max_k, progress=True)
    rows = []
    for k in range(max_k + 1):
        scores = score_vectors(benchmark, sentences, pooled[k])["all"]
        removed = encoder.tokenizer.convert_ids_to_tokens([ranked[k - 1]])[0] if k else ""
        rows.append({"k": k, "last_removed": removed, **{t: round(v, 4) for t, v in scores.items()}})
    write_csv(analysis / "freq_tokens.csv", rows)
    summarize_freq_tokens(rows, label, analysis, plots)
    return rows


def summarize_freq_tokens(rows: list[dict[str, Any]], label: str, analysis: Path, plots: Path) -> None:
    """The plot and summary from the table (also re-drawable from metrics/analysis/freq_tokens.csv)."""
    rows = [{k: (v if k == "last_removed" else float(v)) for k, v in r.items()} for r in rows]
    best = max(rows, key=lambda r: r["avg"])
    summary = {"model": label, "k0_avg": rows[0]["avg"], "best_k": int(best["k"]), "best_avg": best["avg"]}
    (analysis / "freq_tokens.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot_freq_tokens(rows, best, label, plots)


# ------------------------------------------------------------------------------------------- train sweeps


def sweep_params(params: dict[str, Any], overrides: dict[str, Any], steps: int) -> dict[str, Any]:
    """params.yaml for one cell: ``overrides`` go into the ``transfer.base`` recipe (``texts``/``max_texts`` into
    ``transfer``), so every cell has the same encoder dropout and a grid compares views, not dropout."""
    p = merge(params, {})  # a copy of its own
    stage_keys = {k: v for k, v in overrides.items() if k in ("texts", "max_texts")}
    recipe = {k: v for k, v in overrides.items() if k not in stage_keys}
    # Evaluate on STS-B dev only at the start and the end: selection would otherwise dominate a short run. Set
    # in the transfer section, which wins over `train` (params.yaml's transfer.eval_steps would shadow it there).
    p["transfer"] = {**p["transfer"], **stage_keys, "steps": steps, "eval_steps": steps, "patience": 1}
    # The sweeps compare contrastive views, temperatures and batch sizes: the contrastive objective, whatever
    # objective the base recipe trains with in the pipeline (it distils), unless a cell sets one.
    p["transfer"]["base"] = {**p["transfer"]["base"], "objective": "contrastive", **recipe}
    return p


def train_cell(run_cell: RunCell, cell_params: dict[str, Any], work: Path, name: str) -> dict[str, Any]:
    """One sweep cell trained by ``run_cell`` from its own params file; returns its metrics."""
    cell = write_params(cell_params, work / f"{name}.yaml")
    start = time.perf_counter()
    run_cell(cell, work, name)
    metrics = json.loads((work / "metrics" / "train" / f"{name}.json").read_text())
    metrics["wall_s"] = round(time.perf_counter() - start, 1)
    # The last evaluation's STS-B dev, whether or not selection kept it: a view that hurts shows here, while the
    # selected model (scored below) falls back to the init.
    with open(work / "metrics" / "curves" / f"{name}.csv") as f:
        scored = [row for row in csv.DictReader(f) if row.get("stsb_dev")]
    metrics["stsb_dev_end"] = round(float(scored[-1]["stsb_dev"]), 2) if scored else None
    metrics["output"] = work / name
    return metrics


def score_stsb(folder: Path, data: Path) -> dict[str, float]:
    """STS-B test and dev Spearman x 100 of a trained cell's folder."""
    benchmark = load_benchmark(data, tasks=("STSb",), with_dev=True)
    sentences = benchmark.sentences
    result = score_vectors(benchmark, sentences, FastEncoder(folder, backend="torch")(sentences))
    return {"stsb_test": round(result["all"]["STSb"], 4), "stsb_dev": round(result["stsb_dev"], 4)}


def grid_pairs(views: Sequence[str], cells_kind: str) -> list[tuple[str, str]]:
    """aug-grid cells: every ordered pair, or (``single``) each view with itself and with ``none``."""
    pairs = [(v1, v2) for v1 in views for v2 in views]
    if cells_kind == "single":
        pairs = [(v1, v2) for v1, v2 in pairs if v1 == v2 or (v2 == "none" and v1 != "none")]
    return pairs


# The score columns of a sweep's rows; the other columns name the cell.
SWEEP_SCORE_KEYS = ("stsb_dev", "stsb_test", "stsb_dev_step0", "stsb_dev_end", "best_step", "wall_s")


def run_sweep(
    kind: str,
    params: dict[str, Any],
    data: Path,
    init: str,
    steps: int,
    values: Sequence[Any] | None,
    max_texts: Any,
    run_cell: RunCell,
    analysis: Path,
    plots: Path,
    init_label: str | None = None,
    cells_kind: str = "all",
    extra: dict[str, Any] | None = None,
    tag: str | None = None,
    log: logging.Logger = log,
) -> list[dict[str, Any]]:
    """One short transfer from ``init`` per cell (``run_cell``), each scored on STS-B: <name>.csv (rewritten
    after every cell) and <name>.json under ``analysis``, the plot under ``plots``.

    ``cells_kind`` (aug-grid): ``all`` pairs, or ``single``: each view with itself and with ``none``.
    ``extra`` overrides go into every cell (e.g. ``encoder_dropout: true``); ``tag`` names the output files."""
    rows = []
    if kind == "aug-grid":
        pairs = grid_pairs(list(values or GRID_VIEWS), cells_kind)
        cells = [({"views": [v1, v2]}, {"view1": v1, "view2": v2}) for v1, v2 in pairs]
    else:
        key, default_values = SWEEPS[kind]
        cells = [({key: v}, {key: v}) for v in (values or default_values)]
    name = kind.replace("-", "_") + (f"_{tag}" if tag else "")
    with tempfile.TemporaryDirectory(prefix=f"sentcl-{kind}-") as tmp:
        work = Path(tmp)
        for i, (overrides, label) in enumerate(cells):
            if kind != "few-shot" and max_texts is not None:
                overrides = {**overrides, "max_texts": max_texts}
            overrides = {**(extra or {}), **overrides}
            log.info("%s %d/%d: %s", kind, i + 1, len(cells), overrides)
            metrics = train_cell(run_cell, sweep_params(params, overrides, steps), work, f"{kind}-{i}")
            scores = score_stsb(metrics.pop("output"), data)
            rows.append(
                {
                    **label,
                    **scores,
                    "stsb_dev_step0": metrics["stsb_dev_step0"],
                    "stsb_dev_end": metrics["stsb_dev_end"],
                    "best_step": metrics["best_step"],
                    "wall_s": metrics["wall_s"],
                }
            )
            write_csv(analysis / f"{name}.csv", rows)  # partial results survive a stop
    meta = {"init": init, "init_label": init_label, "steps": steps, "max_texts": max_texts, "data": str(data)}
    meta |= {"cells": cells_kind, "overrides": extra or {}}
    (analysis / f"{name}.json").write_text(json.dumps({**meta, "rows": rows}, indent=2) + "\n")
    plot_sweep(kind, rows, meta, plots / f"{name}.png", SWEEPS[kind][0] if kind in SWEEPS else None)
    return rows


def freq_tokens_finding(rows: list[dict[str, Any]]) -> str:
    """What a frequent-token run found, in a few words."""
    best = max(rows, key=lambda r: r["avg"])
    return f"best k = {best['k']}: avg {best['avg']:.2f} against {rows[0]['avg']:.2f} with nothing removed"


def sweep_finding(rows: list[dict[str, Any]]) -> str:
    """What a sweep found: its cell count and the best cell by STS-B dev."""
    if not rows:
        return "no cell"
    best = max(rows, key=lambda r: r["stsb_dev"])
    cell = ", ".join(f"{k}={v}" for k, v in best.items() if k not in SWEEP_SCORE_KEYS)
    return f"{len(rows)} cells; best STS-B dev {best['stsb_dev']:.2f} ({cell})"
