"""Spearman correlation of cosine similarity against gold scores: the STS metric.

The full seven-task benchmark (protocols "all" and "mean", deduplicated encoding) builds on these pieces.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy.stats import spearmanr

Encode = Callable[[Sequence[str]], np.ndarray]


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity; a row paired with an identical row gets exactly 1.

    Why the snap: cos(x, x) computed in floating point is 1 +- a few ulp, differently for each x, which
    breaks the ties among pairs of identical sentences at random; STS12 SMTeuroparl has 65 such pairs and
    its Spearman moves by 0.08 with that noise. Exact ties get the average rank, as Spearman intends.
    """
    same = np.all(a == b, axis=1)
    a = a / np.linalg.norm(a, axis=1, keepdims=True).clip(min=1e-12)
    b = b / np.linalg.norm(b, axis=1, keepdims=True).clip(min=1e-12)
    sims = (a * b).sum(axis=1)
    sims[same & np.isfinite(sims)] = 1.0
    return sims


def spearman100(similarity: np.ndarray, gold: Sequence[float]) -> float:
    """Spearman x 100 between similarities and gold scores: the STS metric."""
    return float(spearmanr(similarity, np.asarray(gold)).statistic * 100)


def spearman_cosine(a: np.ndarray, b: np.ndarray, gold: Sequence[float]) -> float:
    """Spearman x 100 between the cosine of row pairs of ``a`` and ``b`` and the gold scores."""
    return spearman100(cosine(a, b), gold)


class STSEvaluator:
    """Scores an ``encode`` function on a list of (sentence1, sentence2, score); each sentence is encoded once."""

    def __init__(self, pairs: Sequence[tuple[str, str, float]], name: str = "sts") -> None:
        self.name = name
        self.sentences1 = [p[0] for p in pairs]
        self.sentences2 = [p[1] for p in pairs]
        self.gold = [float(p[2]) for p in pairs]
        self.unique = sorted(set(self.sentences1) | set(self.sentences2))

    def __call__(self, encode: Encode) -> float:
        index = {s: i for i, s in enumerate(self.unique)}
        vectors = encode(self.unique)
        a = vectors[[index[s] for s in self.sentences1]]
        b = vectors[[index[s] for s in self.sentences2]]
        return spearman_cosine(a, b, self.gold)
