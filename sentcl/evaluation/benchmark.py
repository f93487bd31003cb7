"""The seven-task STS benchmark (STS12-16, STS-B test, SICK-R test) with both reporting protocols, and the two
dev splits beside it (STS-B dev and SICK-R trial: what selection and the promotion gate read; never the tests).
The dev splits are the selection role of ``sentcl.data.roles``: STS-B dev as published (its test pairs are the
declared convention), SICK-R trial less its pairs that are test pairs.

"all" concatenates every subset of a task and computes one Spearman (the SimCSE/ConSERT protocol, also what
MTEB reports); "mean" averages the per-subset Spearman (SentEval's default). Scores are Spearman x 100 of the
cosine similarity against the gold score. Pairs without a gold score are skipped, as SentEval does.

Encoding is the cost, so the benchmark hands the encoder each unique sentence once (the STS sets repeat many
sentences) and the encoder is free to batch and order them as it likes; see :mod:`sentcl.model.fast_encode`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sentcl.data.roles import pair_key, pair_keys
from sentcl.data.senteval import (
    STS_TASKS,
    TASKS,
    ScoredPair,
    iter_sts_tasks,
    read_sick,
    read_sts_subset,
    read_stsb,
)
from sentcl.evaluation.sts import cosine, spearman100

Encode = Callable[[Sequence[str]], np.ndarray]


@dataclass(frozen=True)
class Subset:
    """One scored file of a task: STS12-16 have several, STS-B and SICK-R one (named after the split)."""

    task: str
    name: str
    sentences1: tuple[str, ...]
    sentences2: tuple[str, ...]
    gold: np.ndarray = field(compare=False)

    @classmethod
    def from_pairs(cls, task: str, name: str, pairs: Sequence[ScoredPair]) -> Subset:
        return cls(
            task,
            name,
            tuple(p.sentence1 for p in pairs),
            tuple(p.sentence2 for p in pairs),
            np.array([p.score for p in pairs], dtype=np.float64),
        )

    def __len__(self) -> int:
        return len(self.gold)


@dataclass(frozen=True)
class Benchmark:
    subsets: tuple[Subset, ...]
    dev: Subset | None = None  # STS-B dev, reported beside the benchmark, never part of it
    skipped_pairs: int = 0
    sick_dev: Subset | None = None  # SICK-R trial (SICK_trial.txt less its test pairs), likewise beside it
    # Further scored sets encoded with it (the unseen-STS pairs: ``sentcl.evaluation.seen``); scored by the
    # caller from the cosines ``evaluate(keep_cosines=True)`` returns, never part of the benchmark's tables.
    extra: tuple[Subset, ...] = ()

    @property
    def dev_subsets(self) -> list[Subset]:
        return [part for part in (self.dev, self.sick_dev) if part is not None]

    @property
    def sentences(self) -> list[str]:
        """Every distinct sentence of the benchmark (and the dev splits), in first-seen order."""
        parts = [*self.subsets, *self.dev_subsets, *self.extra]
        return list(
            dict.fromkeys(s for part in parts for side in (part.sentences1, part.sentences2) for s in side)
        )

    @property
    def pair_count(self) -> int:
        return sum(len(s) for s in self.subsets)


def load_benchmark(root: Path | str, tasks: Sequence[str] = TASKS, with_dev: bool = True) -> Benchmark:
    """Read the benchmark from a folder in SentEval layout (``STS/...``, ``SICK/...``) with the project's readers;
    ``with_dev``: STS-B dev and SICK-R trial too (scored as ``stsb_dev`` and ``sick_dev``; SICK-R trial without
    its pairs that are a test pair of any of the seven tasks, whichever ``tasks`` are scored)."""
    root = Path(root)
    subsets, skipped = [], 0
    for task, subset, folder in iter_sts_tasks(root):
        pairs, unscored = read_sts_subset(folder, task, subset)
        subsets.append(Subset.from_pairs(task, subset, pairs))
        skipped += unscored if task in tasks else 0
    subsets.append(Subset.from_pairs("STSb", "test", read_stsb(root / "STS" / "STSBenchmark", "test")))
    subsets.append(Subset.from_pairs("SICK-R", "test", read_sick(root / "SICK", "test")))
    dev = sick_dev = None
    if with_dev:
        dev = Subset.from_pairs("STSb", "dev", read_stsb(root / "STS" / "STSBenchmark", "dev"))
        tests = pair_keys(p for s in subsets for p in zip(s.sentences1, s.sentences2, strict=True))
        trial = [
            p for p in read_sick(root / "SICK", "dev") if pair_key(p.sentence1, p.sentence2) not in tests
        ]
        sick_dev = Subset.from_pairs("SICK-R", "trial", trial)
    return Benchmark(tuple(s for s in subsets if s.task in tasks), dev, skipped, sick_dev)


def protocol_scores(subsets: Sequence[Subset], similarities: Sequence[np.ndarray]) -> dict:
    """``{"all": {task: .., "avg": ..}, "mean": {...}, "subsets": {"task/subset": ..}}`` from per-subset cosines.

    ``avg`` is the plain mean over the tasks present (seven for the full benchmark).
    """
    by_task: dict[str, list[tuple[Subset, np.ndarray]]] = {}
    for subset, sim in zip(subsets, similarities, strict=True):
        by_task.setdefault(subset.task, []).append((subset, np.asarray(sim, dtype=np.float64)))
    per_subset = {
        f"{s.task}/{s.name}": spearman100(sim, s.gold) for s, sim in zip(subsets, similarities, strict=True)
    }
    all_protocol, mean_protocol = {}, {}
    for task, parts in by_task.items():
        all_protocol[task] = spearman100(
            np.concatenate([sim for _, sim in parts]), np.concatenate([s.gold for s, _ in parts])
        )
        mean_protocol[task] = float(np.mean([per_subset[f"{s.task}/{s.name}"] for s, _ in parts]))
    all_protocol["avg"] = float(np.mean(list(all_protocol.values())))
    mean_protocol["avg"] = float(np.mean(list(mean_protocol.values())))
    return {"all": all_protocol, "mean": mean_protocol, "subsets": per_subset}


def _pair_cosines(subset: Subset, vectors: np.ndarray, index: dict[str, int]) -> np.ndarray:
    a = vectors[[index[s] for s in subset.sentences1]]
    b = vectors[[index[s] for s in subset.sentences2]]
    return cosine(a.astype(np.float64), b.astype(np.float64))


def score_vectors(benchmark: Benchmark, sentences: Sequence[str], vectors: np.ndarray) -> dict:
    """Benchmark scores given one vector per sentence (row ``i`` of ``vectors`` embeds ``sentences[i]``)."""
    index = {s: i for i, s in enumerate(sentences)}
    result = protocol_scores(benchmark.subsets, [_pair_cosines(s, vectors, index) for s in benchmark.subsets])
    if benchmark.dev is not None:
        result["stsb_dev"] = spearman100(_pair_cosines(benchmark.dev, vectors, index), benchmark.dev.gold)
    if benchmark.sick_dev is not None:
        cosines = _pair_cosines(benchmark.sick_dev, vectors, index)
        result["sick_dev"] = spearman100(cosines, benchmark.sick_dev.gold)
    result["skipped_pairs"] = benchmark.skipped_pairs
    return result


def evaluate(benchmark: Benchmark, encode: Encode, keep_cosines: bool = False) -> dict:
    """Encode every unique sentence once with ``encode`` and score the benchmark; adds ``seconds``.
    ``keep_cosines``: also ``cosines``, ``{"subsets": [..], "extra": [..]}`` (one array per subset of
    ``benchmark.subsets`` and ``benchmark.extra``, in order), for scores the caller computes itself."""
    start = time.perf_counter()
    sentences = benchmark.sentences
    vectors = np.asarray(encode(sentences))
    if vectors.shape[0] != len(sentences):
        raise ValueError(f"encode returned {vectors.shape[0]} vectors for {len(sentences)} sentences")
    result = score_vectors(benchmark, sentences, vectors)
    if keep_cosines:
        index = {s: i for i, s in enumerate(sentences)}
        result["cosines"] = {
            part: [_pair_cosines(s, vectors, index) for s in getattr(benchmark, part)]
            for part in ("subsets", "extra")
        }
    result["seconds"] = time.perf_counter() - start
    return result


def order_result(result: dict) -> dict:
    """The result with its keys in the documented order (JSON readers show it as the issue lists it)."""
    keys = ("all", "mean", "stsb_dev", "sick_dev", "subsets", "skipped_pairs", "pooling", "model", "seconds")
    return {k: result[k] for k in keys if k in result} | {k: v for k, v in result.items() if k not in keys}


def markdown_table(results: dict[str, dict], protocol: str = "all", digits: int = 2) -> str:
    """Rows = checkpoints, columns = tasks + Avg., in the shape of ConSERT's Table 3."""
    header = ["Checkpoint", *TASKS, "Avg."]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, result in results.items():
        row = result[protocol]
        cells = [f"{row[t]:.{digits}f}" if t in row else "-" for t in (*TASKS, "avg")]
        lines.append("| " + " | ".join([name, *cells]) + " |")
    return "\n".join(lines) + "\n"


__all__ = [
    "STS_TASKS",
    "TASKS",
    "Benchmark",
    "Subset",
    "evaluate",
    "load_benchmark",
    "markdown_table",
    "order_result",
    "protocol_scores",
    "score_vectors",
    "spearman100",
]
