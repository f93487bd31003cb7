"""The paper's analyses, one command each; none is part of `dvc repro` and none logs or registers anything.

    python -m stages.analyze space          # alignment/uniformity + cosine by gold bucket, before and after training
    python -m stages.analyze freq-tokens    # Spearman with the top-k frequent tokens left out of mean pooling
    python -m stages.analyze aug-grid       # 5 x 5 view pairs in unsupervised transfer -> heat-map
    python -m stages.analyze few-shot       # 1 / 10 / 100 / 1000 / 10000 / all target texts
    python -m stages.analyze temperature    # 0.01 .. 1
    python -m stages.analyze batch-size

Each writes its table under metrics/analysis/ and its plot under plots/ (PNG; dvc.yaml's top-level `plots`
lists them for `dvc plots show`). The training sweeps run `python -m stages.transfer` once per setting on a
scratch copy of params.yaml, with tracking off, and score every result on STS-B dev and test.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from sentcl import params_yaml
from sentcl.encoder import resolve_model_path
from sentcl.evaluation import load_benchmark, score_vectors
from sentcl.fast_encode import FastEncoder
from stages.common import METRICS, MODELS, PLOTS, RAW, ROOT, load_params, offline_hub

log = logging.getLogger("stages.analyze")
ANALYSIS = METRICS / "analysis"
CHECKPOINTS = ("base", "nli", "joint", "transfer-base", "transfer-nli", "transfer-joint")
GRID_VIEWS = ("none", "shuffle", "token_cutoff", "feature_cutoff", "dropout")
SWEEPS: dict[str, tuple[str, list[Any]]] = {
    "few-shot": ("max_texts", [1, 10, 100, 1000, 10000, "all"]),
    "temperature": ("temperature", [0.01, 0.05, 0.1, 0.5, 1.0]),
    "batch-size": ("batch_size", [8, 16, 32, 64, 128]),
}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, name: str) -> None:  # noqa: ANN001 (a matplotlib Figure)
    """Lay out, write plots/<name> and free the figure."""
    fig.tight_layout()
    PLOTS.mkdir(parents=True, exist_ok=True)
    fig.savefig(PLOTS / name, dpi=120)
    _plt().close(fig)


def _write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _models_before_after(params: dict[str, Any], extra: Sequence[str]) -> dict[str, str]:
    """The pretrained model ("before") and every trained checkpoint present ("after"), plus --model folders."""
    models = {f"pretrained ({params['model']['name']})": resolve_model_path(params["model"]["name"])}
    models |= {name: str(MODELS / name) for name in CHECKPOINTS if (MODELS / name).is_dir()}
    for value in extra:
        name, sep, folder = value.partition("=")
        models[name if sep else Path(value).name] = folder if sep else value
    return models


# ------------------------------------------------------------------------------------------------ space


def run_space(
    params: dict[str, Any], data: Path, extra: Sequence[str], split: str = "test"
) -> dict[str, Any]:
    from sentcl.analysis import BUCKETS, bucket_label, space_stats

    benchmark = load_benchmark(data, tasks=("STSb",), with_dev=True)
    subset = benchmark.subsets[0] if split == "test" else benchmark.dev
    sentences = list(dict.fromkeys([*subset.sentences1, *subset.sentences2]))
    index = {s: i for i, s in enumerate(sentences)}
    results, rows = {}, []
    for name, folder in _models_before_after(params, extra).items():
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
    ANALYSIS.mkdir(parents=True, exist_ok=True)
    (ANALYSIS / "space.json").write_text(
        json.dumps({"split": f"STS-B {split}", "models": summary}, indent=2) + "\n"
    )
    _write_csv(ANALYSIS / "collapse.csv", rows)
    _write_csv(
        ANALYSIS / "align_uniform.csv",
        [
            {"model": n, "alignment": s["alignment"], "uniformity": s["uniformity"]}
            for n, s in summary.items()
        ],
    )

    plt = _plt()
    names = list(results)
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names) + 1, 3.8), sharey=True, squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        cos, buckets = results[name]["cosines"], results[name]["buckets"]
        data_by_bucket = [cos[buckets == i] for i in range(len(BUCKETS))]
        ax.boxplot(
            data_by_bucket, tick_labels=[bucket_label(i) for i in range(len(BUCKETS))], showfliers=False
        )
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("gold score bucket (0-5 scale)")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("cosine similarity of the pair (unitless)")
    fig.suptitle(f"STS-B {split}: cosine similarity by gold-score bucket (collapse = boxes all high)")
    _save(fig, "collapse.png")

    fig, ax = plt.subplots(figsize=(8, 6))
    # Checkpoints with the same weights (a stage that never beat its init) share a point: one label each point.
    points: dict[tuple[float, float], list[str]] = {}
    for name, s in summary.items():
        points.setdefault((round(s["alignment"], 6), round(s["uniformity"], 6)), []).append(
            f"{name} ({s['spearman']:.1f})"
        )
    for (alignment, uniformity), labels in points.items():
        ax.scatter(alignment, uniformity, s=40)
        ax.annotate(
            " = ".join(labels), (alignment, uniformity), xytext=(6, 4), textcoords="offset points", fontsize=8
        )
    ax.ticklabel_format(useOffset=False)
    ax.tick_params(axis="x", labelrotation=30)
    ax.margins(x=0.35, y=0.15)
    ax.set_xlabel(
        "alignment: mean squared distance of positive pairs\n(unit sphere, unitless; lower is better)"
    )
    ax.set_ylabel("uniformity: log E exp(-2 d^2) (nats; lower is better)")
    ax.set_title(f"Alignment vs uniformity on STS-B {split}\n(label: Spearman x 100)")
    ax.grid(alpha=0.3)
    _save(fig, "align_uniform.png")
    return summary


# ---------------------------------------------------------------------------------------- frequent tokens


def run_freq_tokens(model: str, data: Path, max_k: int, label: str | None = None) -> list[dict[str, Any]]:
    from sentcl.analysis import pooled_without_frequent, token_frequencies

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
    _write_csv(ANALYSIS / "freq_tokens.csv", rows)
    plot_freq_tokens(rows, label)
    return rows


def plot_freq_tokens(rows: list[dict[str, Any]], label: str) -> None:
    """The plot and summary from the table (also re-drawable from metrics/analysis/freq_tokens.csv)."""
    rows = [{k: (v if k == "last_removed" else float(v)) for k, v in r.items()} for r in rows]
    best = max(rows, key=lambda r: r["avg"])
    summary = {"model": label, "k0_avg": rows[0]["avg"], "best_k": int(best["k"]), "best_avg": best["avg"]}
    (ANALYSIS / "freq_tokens.json").write_text(json.dumps(summary, indent=2) + "\n")
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ks = [r["k"] for r in rows]
    ax.plot(ks, [r["avg"] for r in rows], label="avg of 7 tasks", linewidth=2.2)
    ax.plot(ks, [r["STSb"] for r in rows], label="STS-B test", linestyle="--")
    ax.axvline(best["k"], color="grey", linestyle=":", label=f"best k = {int(best['k'])}")
    ax.set_xlabel("k: most frequent tokens left out of mean pooling (count)")
    ax.set_ylabel('Spearman x 100 ("all" protocol)')
    ax.set_title(f"Frequent-token removal, {label}\n(token counts over the 7 STS test sets)")
    ax.grid(alpha=0.3)
    ax.legend()
    _save(fig, "freq_tokens.png")


# ------------------------------------------------------------------------------------------- train sweeps


def sweep_params(params: dict[str, Any], overrides: dict[str, Any], steps: int) -> dict[str, Any]:
    """params.yaml for one cell: ``overrides`` go into the ``transfer.base`` recipe (``texts``/``max_texts`` into
    ``transfer``), so every cell has the same encoder dropout and a grid compares views, not dropout."""
    p = json.loads(json.dumps(params))
    stage_keys = {k: v for k, v in overrides.items() if k in ("texts", "max_texts")}
    recipe = {k: v for k, v in overrides.items() if k not in stage_keys}
    # Evaluate on STS-B dev only at the start and the end: selection would otherwise dominate a short run. Set
    # in the transfer section, which wins over `train` (params.yaml's transfer.eval_steps would shadow it there).
    p["transfer"] = {**p["transfer"], **stage_keys, "steps": steps, "eval_steps": steps, "patience": 1}
    p["transfer"]["base"] = {**p["transfer"]["base"], **recipe}
    return p


def transfer_run(
    params: dict[str, Any], overrides: dict[str, Any], work: Path, name: str, init: str, steps: int
) -> dict[str, Any]:
    """One `stages.transfer` run of a sweep cell, tracking off; returns its metrics."""
    params_file = work / f"{name}.yaml"
    params_file.write_text(yaml.safe_dump(sweep_params(params, overrides, steps)))
    output = work / name
    cmd = [
        sys.executable,
        "-m",
        "stages.transfer",
        "--init",
        init,
        "--recipe",
        "base",
        "--params",
        str(params_file),
    ]
    cmd += ["--output", str(output), "--stage", name, "--metrics-dir", str(work / "metrics")]
    cmd += ["--checkpoints-dir", str(work / "checkpoints"), "--steps", str(steps)]
    env = dict(os.environ, SENTCL_MLFLOW="0", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    start = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, env=env)
    metrics = json.loads((work / "metrics" / "train" / f"{name}.json").read_text())
    metrics["wall_s"] = round(time.perf_counter() - start, 1)
    # The last evaluation's STS-B dev, whether or not selection kept it: a view that hurts shows here, while the
    # selected model (scored below) falls back to the init.
    with open(work / "metrics" / "curves" / f"{name}.csv") as f:
        scored = [row for row in csv.DictReader(f) if row.get("stsb_dev")]
    metrics["stsb_dev_end"] = round(float(scored[-1]["stsb_dev"]), 2) if scored else None
    metrics["output"] = output
    return metrics


def _score_stsb(folder: Path, data: Path) -> dict[str, float]:
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
    init_label: str | None = None,
    cells_kind: str = "all",
    extra: dict[str, Any] | None = None,
    tag: str | None = None,
) -> list[dict[str, Any]]:
    """``cells_kind`` (aug-grid): ``all`` pairs, or ``single``: each view with itself and with ``none``.
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
            metrics = transfer_run(params, overrides, work, f"{kind}-{i}", init, steps)
            scores = _score_stsb(metrics.pop("output"), data)
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
            _write_csv(ANALYSIS / f"{name}.csv", rows)  # partial results survive a stop
    meta = {"init": init, "init_label": init_label, "steps": steps, "max_texts": max_texts, "data": str(data)}
    meta |= {"cells": cells_kind, "overrides": extra or {}}
    (ANALYSIS / f"{name}.json").write_text(json.dumps({**meta, "rows": rows}, indent=2) + "\n")
    _plot_sweep(kind, rows, meta, name)
    return rows


def _plot_sweep(kind: str, rows: list[dict[str, Any]], meta: dict[str, Any], name: str) -> None:
    plt = _plt()
    init = meta.get("init_label") or Path(str(meta["init"])).name
    texts = "" if meta.get("max_texts") is None else f", {meta['max_texts']} texts"
    overrides = "".join(f", {k} {v}" for k, v in (meta.get("overrides") or {}).items())
    subtitle = f"transfer from {init}, {meta['steps']} steps{texts}{overrides}"
    if kind == "aug-grid":
        views = list(dict.fromkeys(r["view1"] for r in rows))
        grid = np.full((len(views), len(views)), np.nan)
        for r in rows:
            grid[views.index(r["view1"]), views.index(r["view2"])] = r["stsb_test"]
        fig, ax = plt.subplots(figsize=(6.5, 5.5))
        image = ax.imshow(grid, cmap="viridis")
        for i in range(len(views)):
            for j in range(len(views)):
                if not np.isnan(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", color="white", fontsize=8)
        ax.set_xticks(range(len(views)), views, rotation=30)
        ax.set_yticks(range(len(views)), views)
        ax.set_xlabel("second view (augmentation)")
        ax.set_ylabel("first view (augmentation)")
        fig.colorbar(image, label="STS-B test Spearman x 100")
        ax.set_title(f"Augmentation pairs: STS-B test Spearman\n{subtitle}")
    else:
        key = SWEEPS[kind][0]
        labels = [str(r[key]) for r in rows]
        fig, ax = plt.subplots(figsize=(6.5, 4.5))
        ax.plot(labels, [r["stsb_test"] for r in rows], marker="o", label="STS-B test")
        ax.plot(labels, [r["stsb_dev"] for r in rows], marker="s", linestyle="--", label="STS-B dev")
        ax.axhline(rows[0]["stsb_dev_step0"], color="grey", linestyle=":", label="STS-B dev before training")
        unit = {
            "max_texts": "target texts (count)",
            "temperature": "temperature tau (unitless)",
            "batch_size": "batch size (sentences)",
        }[key]
        ax.set_xlabel(unit)
        ax.set_ylabel("Spearman x 100")
        ax.set_title(f"{kind}: {subtitle}")
        ax.grid(alpha=0.3)
        ax.legend()
    _save(fig, f"{name}.png")


def _value(text: str) -> Any:
    return params_yaml.load(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("analysis", choices=["space", "freq-tokens", "aug-grid", *SWEEPS])
    parser.add_argument("--data", type=Path, default=RAW, help="SentEval layout folder (default data/raw)")
    parser.add_argument(
        "--model", action="append", default=[], help="space: extra NAME=DIR; freq-tokens: the model"
    )
    parser.add_argument("--max-k", type=int, default=50, help="freq-tokens: largest k")
    parser.add_argument("--init", help="sweeps: model to transfer from (default: params model.name)")
    parser.add_argument("--steps", type=int, default=30, help="sweeps: transfer steps per run")
    parser.add_argument(
        "--max-texts", type=_value, default=2000, help="sweeps: target texts per run (all = every)"
    )
    parser.add_argument(
        "--values", help="sweeps: comma-separated values (aug-grid: views) instead of the defaults"
    )
    parser.add_argument(
        "--cells",
        choices=["all", "single"],
        default="all",
        help="aug-grid: every pair, or each view with itself and with none",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="sweeps: a transfer.base recipe override for every cell, e.g. encoder_dropout=true",
    )
    parser.add_argument("--tag", help="sweeps: suffix of the output files (metrics/analysis, plots)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    offline_hub()
    params = load_params()
    ANALYSIS.mkdir(parents=True, exist_ok=True)
    started = time.time()
    if args.analysis == "space":
        run_space(params, args.data, args.model)
        found = "alignment, uniformity and cosine by gold-score bucket"
        written = ["metrics/analysis/collapse.csv", "plots/collapse.png", "plots/align_uniform.png"]
    elif args.analysis == "freq-tokens":
        if args.model:
            label, _, model = (
                args.model[0].rpartition("=") if "=" in args.model[0] else ("", "", args.model[0])
            )
        else:
            label, model = params["model"]["name"], resolve_model_path(params["model"]["name"])
        rows = run_freq_tokens(model, args.data, args.max_k, label or None)
        best = max(rows, key=lambda r: r["avg"])
        found = (
            f"best k = {best['k']}: avg {best['avg']:.2f} against {rows[0]['avg']:.2f} with nothing removed"
        )
        written = ["metrics/analysis/freq_tokens.csv", "plots/freq_tokens.png"]
    else:
        values = [_value(v) for v in args.values.split(",")] if args.values else None
        init = args.init or resolve_model_path(params["model"]["name"])
        label = args.init or params["model"]["name"]
        extra = {key: _value(value) for key, _, value in (item.partition("=") for item in args.set)}
        rows = run_sweep(
            args.analysis,
            params,
            args.data,
            init,
            args.steps,
            values,
            args.max_texts,
            label,
            cells_kind=args.cells,
            extra=extra,
            tag=args.tag,
        )
        name = args.analysis.replace("-", "_") + (f"_{args.tag}" if args.tag else "")
        best = max(rows, key=lambda r: r["stsb_dev"]) if rows else None
        cell = ", ".join(f"{k}={v}" for k, v in best.items() if k not in SWEEP_SCORE_KEYS) if best else "-"
        found = f"{len(rows)} cells; best STS-B dev {best['stsb_dev']:.2f} ({cell})" if best else "no cell"
        written = [f"metrics/analysis/{name}.csv", f"plots/{name}.png"]
    # One line that says what the run found and where it wrote it.
    print(f"analyze {args.analysis}: {found} -> {', '.join(written)} ({time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
