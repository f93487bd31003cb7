"""Distillation from a stronger encoder (the teacher) on unlabeled text: the ``distill`` objective piece.

The teacher never runs during training: its vectors are computed once per text (``stages.teacher``, fp16) and
looked up by sentence (``sentcl.model.teacher.TeacherVectors``). Three losses, weighted by ``distill.weight``:

``similarity_mse``  the student's in-batch cosine matrix regressed on the teacher's (MSE over the off-diagonal
                    entries). Dimension-free: a 384-d student learns from a 768-d teacher without a projection.
                    With examples of several sentences (neighbours, pairs), ``group_weight`` weighs the entries
                    between the sentences of one example against 1 for the rest of the batch (our own weighting,
                    measured in docs/results.md; 1 is the plain mean).
``listnet``         RankCSE's ranking distillation (perceptiveshawty/RankCSE rankcse/models.py ``ListNet``):
                    each row of the student's cosine matrix at temperature tau and of the teacher's at tau / 2,
                    the diagonal masked out; loss = -sum(q * log p) / sum(q), q the teacher's row softmax.
``pair_mse``        each unlabeled pair's student cosine regressed on the teacher's (``examples`` neighbours or
                    pairs): sentence-transformers' CosineSimilarityLoss with the teacher as the labeller.
``embedding_mse``   sentence-transformers' distillation (examples/training/distillation/model_distillation.py,
                    ``losses.MSELoss``: mean squared error between the student's vector and the teacher's). The
                    dimensions differ, so either the teacher is projected to the student's dimension with PCA
                    fitted on the teacher's vectors of the training text (the example's ``Dense`` of PCA
                    components, no bias, no centring), or the student is mapped to the teacher's with a learned
                    linear layer (``projection: learned``, trained at ``head_lr``, dropped when saving).

``distill.examples: neighbours`` puts each sentence in a batch with its ``distill.neighbours`` nearest teacher
neighbours (augmented SBERT's top-k semantic search), so a batch holds dense local groups as well as random ones.

``distill.contrastive`` > 0 adds ConSERT's contrastive term over the recipe's two views at that weight (the
``train.loss`` over ``views`` at ``temperature``); the similarity losses then compare the two views' vectors
(z1 against z2, as RankCSE does), else each sentence's single pass with itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

DISTILL_LOSSES = ("similarity_mse", "listnet", "embedding_mse", "pair_mse")
PROJECTIONS = ("pca", "learned")
DISTILL_EXAMPLES = ("sentences", "neighbours", "pairs")


@dataclass
class DistillConfig:
    """``train.distill`` in params.yaml (objective ``distill`` only); params.yaml holds the defaults."""

    loss: str  # similarity_mse | listnet | embedding_mse
    weight: float  # of the distillation term
    temperature: float  # listnet: the student's tau (the teacher's is tau / 2, RankCSE)
    projection: str  # embedding_mse: pca (teacher -> student dim) | learned (student -> teacher dim)
    contrastive: float  # weight of ConSERT's contrastive term over the two views; 0 = distillation alone
    examples: str  # sentences (random batches) | neighbours (each with its nearest neighbours) | pairs
    neighbours: int  # examples neighbours: how many nearest teacher neighbours join each sentence (k)
    # similarity_mse over neighbours or pairs: weight of the entries within one example (1 = the plain mean)
    group_weight: float
    # examples neighbours: the share of groups trained on, those whose student cosines (the sentence to each of
    # its neighbours) are furthest from the teacher's before training; 1 = every group, no student pass
    keep_hardest: float

    def __post_init__(self) -> None:
        if self.loss not in DISTILL_LOSSES:
            raise ValueError(f"distill.loss: one of {', '.join(DISTILL_LOSSES)}, got {self.loss!r}")
        if self.examples not in DISTILL_EXAMPLES:
            raise ValueError(f"distill.examples: one of {', '.join(DISTILL_EXAMPLES)}, got {self.examples!r}")
        if self.projection not in PROJECTIONS:
            raise ValueError(f"distill.projection: one of {', '.join(PROJECTIONS)}, got {self.projection!r}")
        for key in ("weight", "temperature", "contrastive"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"distill.{key}: a number not below 0, got {value!r}")
        weight = self.group_weight
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0:
            raise ValueError(f"distill.group_weight: a number greater than 0, got {weight!r}")
        if self.loss == "pair_mse" and self.examples == "sentences":
            raise ValueError(
                "distill.loss pair_mse needs distill.examples neighbours or pairs, got sentences"
            )
        if self.temperature == 0:
            raise ValueError("distill.temperature: greater than 0, got 0")
        keep = self.keep_hardest
        if isinstance(keep, bool) or not isinstance(keep, int | float) or not 0 < keep <= 1:
            raise ValueError(f"distill.keep_hardest: a share in (0, 1], got {keep!r}")
        if keep < 1 and self.examples != "neighbours":
            raise ValueError(
                f"distill.keep_hardest {keep} needs distill.examples neighbours, got {self.examples}"
            )
        if isinstance(self.neighbours, bool) or not isinstance(self.neighbours, int) or self.neighbours < 1:
            raise ValueError(f"distill.neighbours: a whole number from 1, got {self.neighbours!r}")


def cosine_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.normalize(a.float(), dim=-1) @ F.normalize(b.float(), dim=-1).T


def _off_diagonal(m: torch.Tensor) -> torch.Tensor:
    n = m.shape[0]
    return m[~torch.eye(n, dtype=torch.bool, device=m.device)]


def similarity_mse(
    student: torch.Tensor,
    teacher: torch.Tensor,
    example: torch.Tensor | None = None,
    group_weight: float = 1.0,
) -> torch.Tensor:
    """Mean squared difference of the off-diagonal entries of two in-batch cosine matrices. With ``example`` (the
    example each row belongs to), an entry between two sentences of one example weighs ``group_weight`` and every
    other entry 1: a weighted mean."""
    if example is None or group_weight == 1:
        return F.mse_loss(_off_diagonal(student), _off_diagonal(teacher))
    # Why: in a batch of 32 groups of a sentence and its 3 neighbours, 3 of a row's 127 entries are neighbours;
    # the rest are unrelated sentences whose cosines sit near 0 under both models, while the STS pairs live in
    # the neighbours' range. The plain mean spends 98% of the loss there (docs/results.md, "A group's own similarities").
    same = (example[:, None] == example[None, :]).float()
    weights = _off_diagonal(1 + (group_weight - 1) * same)
    gaps = _off_diagonal((student - teacher) ** 2)
    return (weights * gaps).sum() / weights.sum()


def listnet(student: torch.Tensor, teacher: torch.Tensor, tau: float) -> torch.Tensor:
    """RankCSE ``ListNet.forward`` on cosine matrices: student logits cos / tau, teacher cos / (tau / 2)."""
    eye = torch.eye(student.shape[0], dtype=torch.bool, device=student.device)
    p = F.log_softmax((student / tau).masked_fill(eye, float("-inf")), dim=-1)
    q = F.softmax((teacher / (tau / 2)).masked_fill(eye, float("-inf")), dim=-1)
    return -(q * p).nansum() / q.nansum()


def pca_components(vectors: np.ndarray, dim: int) -> torch.Tensor:
    """The top ``dim`` principal axes of ``vectors`` ([dim, teacher dim]), as sklearn's PCA finds them (centred
    SVD) and the example uses them (``Dense`` weight, applied to uncentred vectors)."""
    x = np.asarray(vectors, dtype=np.float64)
    x = x - x.mean(0, keepdims=True)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    if vt.shape[0] < dim:
        raise ValueError(f"PCA to {dim} dimensions needs at least {dim} teacher vectors, got {len(vectors)}")
    return torch.from_numpy(vt[:dim].astype(np.float32))


def nearest_neighbours(vectors: np.ndarray, k: int = 1, chunk: int = 2048) -> np.ndarray:
    """Row indices of each vector's ``k`` most cosine-similar other vectors, nearest first ([n, k]; exact search,
    ``chunk`` rows at a time)."""
    x = np.asarray(vectors, dtype=np.float32)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    if not 1 <= k < len(x):
        raise ValueError(f"{k} nearest neighbours need more than {k} sentences, got {len(x)}")
    best = np.empty((len(x), k), dtype=np.int64)
    for start in range(0, len(x), chunk):
        sims = x[start : start + chunk] @ x.T
        rows = np.arange(sims.shape[0])
        sims[rows, start + rows] = -np.inf  # never the sentence itself
        # torch's top-k over each row (numpy's argpartition took 8 of the 14 s on 22,780 sentences)
        values, top = (t.numpy() for t in torch.topk(torch.from_numpy(sims), k, dim=1))
        # nearest first; equal cosines by index, so the order does not depend on how top-k breaks ties
        order = np.lexsort((top, -values), axis=1)
        best[start : start + chunk] = np.take_along_axis(top, order, axis=1)
    return best


def neighbour_groups(texts: Sequence[str], teacher: Any, k: int = 1) -> list[tuple[str, ...]]:
    """Each sentence with its ``k`` nearest neighbours in ``texts`` under the teacher, nearest first: augmented
    SBERT's semantic-search sampling (sentence-transformers examples/training/data_augmentation/
    train_sts_indomain_semantic.py pairs each sentence with its top-k neighbours by a bi-encoder and lets a
    stronger model label the pairs). Here the teacher's in-batch similarities are the labels, so a group of
    k + 1 sentences and the other groups of its batch are learned together. Needs more than ``k`` sentences."""
    texts = list(texts)
    if len(texts) <= k:
        raise ValueError(f"distill.examples neighbours: {k} neighbours need more than {k} training sentences")
    best = nearest_neighbours(teacher.lookup(texts), k)
    return [(texts[i], *(texts[j] for j in row)) for i, row in enumerate(best)]


def hardest_groups(
    groups: Sequence[tuple[str, ...]], teacher: Any, student: Any, keep: float
) -> list[tuple[str, ...]]:
    """The ``keep`` share of ``groups`` (a sentence and its neighbours) on which the student disagrees most with
    the teacher before training: per group, the summed squared gap between the student's and the teacher's
    cosine of the sentence to each neighbour. ``student(sentences) -> vectors``. Their order is kept."""
    sentences = sorted({s for group in groups for s in group})
    index = {s: i for i, s in enumerate(sentences)}

    def unit(vectors: np.ndarray) -> np.ndarray:
        x = np.asarray(vectors, dtype=np.float64)
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)

    t, s = unit(teacher.lookup(sentences)), unit(student(sentences))
    rows = np.array([[index[x] for x in group] for group in groups])
    gaps = np.zeros(len(groups))
    for j in range(1, rows.shape[1]):
        a, b = rows[:, 0], rows[:, j]
        gaps += ((s[a] * s[b]).sum(1) - (t[a] * t[b]).sum(1)) ** 2
    kept = max(1, round(keep * len(groups)))
    return [groups[i] for i in np.sort(np.argsort(-gaps, kind="stable")[:kept])]


class Distill(nn.Module):
    """The ``distill`` objective (an ``sentcl.training.objectives.base.Objective``): sentences in, the teacher's vectors
    looked up, the configured loss out. ``contrastive`` is a ``sentcl.training.objectives.contrastive.Contrastive`` (alpha = its
    weight) or None."""

    examples = "sentences"
    head_parameters: tuple[str, ...] = ()

    def __init__(self, config: DistillConfig, dim: int, teacher: Any, contrastive: nn.Module | None) -> None:
        super().__init__()
        self.config, self.teacher, self.contrastive = config, teacher, contrastive
        self.examples = "sentences" if config.examples == "sentences" else "pairs"
        # sentences an example holds: a sentence and its k neighbours, or an unlabeled pair
        self.group = config.neighbours + 1 if config.examples == "neighbours" else 2
        self.projection: nn.Module | None = None
        if config.loss == "embedding_mse":
            if config.projection == "learned":
                self.projection = nn.Linear(dim, teacher.dim, bias=False)
                self.head_parameters = ("projection",)
            else:
                self.register_buffer("pca", pca_components(teacher.vectors, dim))

    def representations(self, embed: Any, items: Sequence[Any]) -> dict[str, torch.Tensor]:
        if self.examples == "pairs":
            # (sentence, neighbours...) or (a, b), flattened position-major: group x len(items)
            items = [item[side] for side in range(self.group) for item in items]
        batch = embed.tokenize(list(items))
        views = self.contrastive.views if self.contrastive is not None else ("none", "none")
        reps = {"z1": embed(batch, views[0])}
        if self.contrastive is not None:
            reps["z2"] = embed(batch, views[1])
        reps["teacher"] = torch.from_numpy(self.teacher.lookup(list(items))).to(reps["z1"].device)
        return reps

    def distill_loss(self, reps: dict[str, torch.Tensor]) -> torch.Tensor:
        # Detached: the teacher is read only (and gradient caching then leaves it out of the replay).
        t = reps["teacher"].detach().float()
        z1 = reps["z1"].float()
        z2 = reps["z2"].float() if "z2" in reps else z1
        cfg = self.config
        if cfg.loss == "embedding_mse":
            if self.projection is not None:
                return F.mse_loss(self.projection(z1), t)
            return F.mse_loss(z1, t @ self.pca.T)
        student, teacher = cosine_matrix(z1, z2), cosine_matrix(t, t)
        if cfg.loss == "pair_mse":
            # sentence-transformers CosineSimilarityLoss (losses/CosineSimilarityLoss.py: MSE of cos(u, v) and the
            # label) with the teacher's cosine as the silver label, as augmented SBERT labels its sampled pairs
            # (examples/training/data_augmentation/train_sts_indomain_semantic.py). Rows [0, n) are the sentences
            # and [s n, (s + 1) n) their s-th partners (``representations``): pair (i, s) is entry (i, s n + i).
            n = student.shape[0] // self.group
            rows = torch.arange(n, device=student.device)
            cols = torch.cat([rows + side * n for side in range(1, self.group)])
            rows = rows.repeat(self.group - 1)
            return F.mse_loss(student[rows, cols], teacher[rows, cols])
        if cfg.loss == "listnet":
            return listnet(student, teacher, cfg.temperature)
        example = None
        if self.examples == "pairs":
            # rows side x n + i (``representations``): row r belongs to example r mod n
            n = student.shape[0] // self.group
            example = torch.arange(student.shape[0], device=student.device) % n
        return similarity_mse(student, teacher, example, cfg.group_weight)

    def loss(self, reps: dict[str, torch.Tensor], negatives: torch.Tensor | None = None) -> torch.Tensor:
        loss = self.config.weight * self.distill_loss(reps)
        if self.contrastive is not None:
            loss = loss + self.contrastive.loss(reps, negatives)
        return loss
