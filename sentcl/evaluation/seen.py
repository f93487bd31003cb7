"""Scores split by what a checkpoint saw in training, and the scored STS pairs no stage trained on.

A checkpoint's *seen* set is every sentence the training stages of its lineage trained on (each stage records
them: ``data/seen/<stage>.txt``). Each test pair is then ``seen`` (both sentences in it), ``unseen`` (neither)
or ``mixed``, and each task's Spearman is reported per split with its pair count (protocol "all": a task's
subsets concatenated). A gain on ``seen`` pairs is transductive (the model trained on those very sentences);
only ``unseen`` says what it learned that carries to new sentences.

Sentences match by the project's one rule of "same sentence" (``sentcl.data.roles.normalise``: case, accents,
punctuation and spaces ignored), the rule the training text is kept apart from the dev splits by: a test sentence
that differs from a trained one only in case, spacing or punctuation counts as seen.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from sentcl.data.roles import normalise, sentence_keys, unseen_check
from sentcl.evaluation.benchmark import Subset
from sentcl.evaluation.sts import spearman100

SPLITS = ("seen", "unseen", "mixed")
# A pair of no trained sentence, one of whose sentences a run's selection or gate read (a retrain's held-out
# sentences, a dev split): not unseen, whatever it trained on (``read`` of ``pair_splits``).
READ = "read"
MIN_PAIRS = 30  # a split with fewer pairs gets its count, not a score: a Spearman of so few pairs is noise
# In a checkpoint's seen_split: the base model's averages over the very same seen / unseen / mixed pairs.
BASE_SAME_PAIRS = "base_same_pairs"
UNSEEN_STS = "unseen_sts"  # the key of the set of scored pairs no stage trained on, in each row of sts.json
UNSEEN_DESCRIPTION = (
    "the STS-B train and SICK-R train pairs (data/processed/pairs.parquet) none of whose two sentences is a "
    "sentence of a test set, STS-B dev, SICK-R trial or any training stage's text (case, accents, punctuation "
    "and spaces ignored: sentcl.data.roles); Spearman per source, averaged weighted by pairs"
)


def seen_keys(texts: Iterable[str]) -> frozenset[str]:
    """The keys (``normalise``) of the sentences a checkpoint trained on."""
    return sentence_keys(texts)


def pair_splits(subset: Subset, seen: frozenset[str], read: frozenset[str] = frozenset()) -> np.ndarray:
    """Each pair's split: ``seen`` (both sentences in ``seen``), ``unseen`` (neither, and neither in ``read``:
    the keys of every sentence selection or a gate read), ``READ`` (neither in ``seen``, one in ``read``) or
    ``mixed`` (one in ``seen``)."""

    def holds(keys: frozenset[str]) -> np.ndarray:
        return np.array(
            [[normalise(s) in keys for s in side] for side in (subset.sentences1, subset.sentences2)],
            dtype=bool,
        ).reshape(2, -1)

    trained, selected = holds(seen), holds(read)
    both, either = trained[0] & trained[1], trained[0] | trained[1]
    untrained = np.where(selected[0] | selected[1], READ, "unseen")
    return np.where(both, "seen", np.where(either, "mixed", untrained))


def _score(cosines: np.ndarray, gold: np.ndarray) -> dict[str, Any]:
    n = len(gold)
    return {"pairs": int(n), "spearman": spearman100(cosines, gold) if n >= MIN_PAIRS else None}


def split_scores(
    subsets: Sequence[Subset],
    cosines: Sequence[np.ndarray],
    seen: frozenset[str],
    read: frozenset[str] | None = None,
) -> dict[str, Any]:
    """``{"tasks": {task: {split: {pairs, spearman}}}, "avg": {split: {spearman, tasks, pairs}}}``.

    Per task, the pairs of its subsets concatenated (protocol "all"); ``spearman`` is None below ``MIN_PAIRS``.
    ``avg``: the mean over the tasks that have a score for the split (``tasks`` says how many), and the
    split's pairs over all tasks. With ``read`` (see ``pair_splits``) there is a fourth split, ``READ``."""
    splits = SPLITS if read is None else (*SPLITS, READ)
    by_task: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    for subset, sim in zip(subsets, cosines, strict=True):
        labels = pair_splits(subset, seen, read or frozenset())
        by_task.setdefault(subset.task, []).append((np.asarray(sim, dtype=np.float64), subset.gold, labels))
    tasks: dict[str, dict[str, Any]] = {}
    for task, parts in by_task.items():
        sims = np.concatenate([p[0] for p in parts])
        gold = np.concatenate([p[1] for p in parts])
        labels = np.concatenate([p[2] for p in parts])
        tasks[task] = {split: _score(sims[labels == split], gold[labels == split]) for split in splits}
    avg = {}
    for split in splits:
        scores = [row[split]["spearman"] for row in tasks.values() if row[split]["spearman"] is not None]
        avg[split] = {
            "spearman": float(np.mean(scores)) if scores else None,
            "tasks": len(scores),
            "pairs": sum(row[split]["pairs"] for row in tasks.values()),
        }
    return {"tasks": tasks, "avg": avg}


def unseen_sts_subsets(pairs: pd.DataFrame, training_texts: Iterable[str]) -> tuple[Subset, ...]:
    """The scored STS pairs that no stage trained on and no evaluation reads, one subset per source task: the
    unseen-check role of ``sentcl.data.roles.unseen_check`` (STS-B train and SICK-R train pairs neither of whose
    sentences is a sentence of an evaluated split or of ``training_texts``, the union of every training stage's
    text), in the table's order."""
    kept = unseen_check(pairs, training_texts)
    subsets = []
    for task in ("STSb", "SICK-R"):
        frame = kept[kept.task == task]
        subsets.append(
            Subset(
                task,
                "train",
                tuple(frame.sentence1),
                tuple(frame.sentence2),
                frame.score.to_numpy(dtype=np.float64),
            )
        )
    return tuple(subsets)


def unseen_sts_scores(subsets: Sequence[Subset], cosines: Sequence[np.ndarray]) -> dict[str, Any]:
    """``{"pairs", "spearman", "sources": {"<task> train": {pairs, spearman}}}``: Spearman x 100 per source
    (gold scales differ: STS-B 0-5, SICK 1-5, so sources are not concatenated), ``spearman`` their mean weighted
    by pairs over the sources with at least ``MIN_PAIRS`` pairs (None if none has): on the pipeline's data one
    source holds some 700 pairs and the other a few dozen, whose Spearman must not weigh as much."""
    sources = {
        f"{s.task} {s.name}": _score(np.asarray(sim, dtype=np.float64), s.gold)
        for s, sim in zip(subsets, cosines, strict=True)
    }
    scored = [(row["spearman"], row["pairs"]) for row in sources.values() if row["spearman"] is not None]
    weight = sum(n for _, n in scored)
    return {
        "pairs": sum(row["pairs"] for row in sources.values()),
        "spearman": sum(v * n for v, n in scored) / weight if scored else None,
        "sources": sources,
    }


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _gain(value: float | None, base: float | None) -> str:
    """``; base B, +G`` when both are scores (the base on the same pairs), else nothing."""
    return "" if value is None or base is None else f"; base {base:.2f}, {value - base:+.2f}"


def split_markdown(results: dict[str, dict[str, Any]], reference: str = "base") -> str:
    """The split tables of sts.md: per checkpoint, the average over tasks per split (pairs; the ``reference``
    model's average over the same pairs and the gain, where known), and the unseen-STS set (the same pairs for
    every checkpoint); then per task the splits' Spearman (pairs)."""
    rows = {name: row for name, row in results.items() if row.get("seen_split")}
    if not rows:
        return ""
    lines = [
        "| Checkpoint | Seen avg. (pairs) | Unseen avg. (pairs) | Mixed avg. (pairs) | Unseen STS (pairs) |",
        "|---|---|---|---|---|",
    ]
    base_unseen = (rows.get(reference, {}).get(UNSEEN_STS) or {}).get("spearman")
    for name, row in rows.items():
        avg, same = row["seen_split"]["avg"], row["seen_split"].get(BASE_SAME_PAIRS) or {}
        cells = [
            f"{_cell(avg[s]['spearman'])} ({avg[s]['pairs']}"
            + _gain(avg[s]["spearman"], (same.get(s) or {}).get("spearman"))
            + ")"
            for s in SPLITS
        ]
        unseen = row.get(UNSEEN_STS) or {}
        base = base_unseen if name != reference else None
        cells.append(
            f"{_cell(unseen.get('spearman'))} ({unseen.get('pairs', 0)}{_gain(unseen.get('spearman'), base)})"
        )
        lines.append("| " + " | ".join([name, *cells]) + " |")
    tasks = list(next(iter(rows.values()))["seen_split"]["tasks"])
    lines += ["", "| Checkpoint | Split | " + " | ".join(tasks) + " |", "|---|---|" + "---|" * len(tasks)]
    for name, row in rows.items():
        for split in SPLITS:
            table = row["seen_split"]["tasks"]
            cells = [f"{_cell(table[t][split]['spearman'])} ({table[t][split]['pairs']})" for t in tasks]
            lines.append("| " + " | ".join([name, split, *cells]) + " |")
    return "\n".join(lines) + "\n"
