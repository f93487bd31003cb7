"""The analyses' plots (PNG, matplotlib's Agg backend: no display needed), each drawn from the rows its analysis
writes, so a plot can be redrawn from its table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from sentcl.evaluation.analysis import BUCKETS, bucket_label


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> None:  # noqa: ANN001 (a matplotlib Figure)
    """Lay out, write ``path`` and free the figure."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    _plt().close(fig)


def plot_space(results: dict[str, Any], summary: dict[str, Any], split: str, plots: Path) -> None:
    """collapse.png (cosine by gold bucket, one panel per model) and align_uniform.png under ``plots``."""
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
    save_figure(fig, plots / "collapse.png")

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
    save_figure(fig, plots / "align_uniform.png")


def plot_freq_tokens(rows: list[dict[str, Any]], best: dict[str, Any], label: str, plots: Path) -> None:
    """freq_tokens.png: the average and STS-B test Spearman against k, the best k marked."""
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
    save_figure(fig, plots / "freq_tokens.png")


def plot_sweep(
    kind: str, rows: list[dict[str, Any]], meta: dict[str, Any], path: Path, swept: str | None = None
) -> None:
    """A sweep's plot: the aug-grid heat-map of STS-B test, or STS-B dev and test against the ``swept`` key."""
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
        key = swept
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
    save_figure(fig, path)
