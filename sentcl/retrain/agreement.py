"""Selecting and gating a retrain without labels: a held-out share of the domain text, scored by the teacher.

A retrain's inbox has no scored pairs, and STS-B dev does not contain the team's domain. So a share of the domain
text is set aside before the teacher stage and never trained on; pairs are built among those held-out sentences
the way augmented SBERT samples unlabelled pairs (Thakur et al., 2021): each sentence with its ``neighbours``
nearest sentences under the teacher (sentence-transformers examples/training/data_augmentation/
train_sts_indomain_semantic.py: ``util.semantic_search(..., top_k)`` over the unlabelled sentences) and with
``random`` sentences drawn at random (the paper's random sampling, which keeps dissimilar pairs in the set).
The teacher's cosine is each pair's score. A checkpoint's agreement is the Spearman of its cosines with the
teacher's on these pairs, so selection and the gate read the student's distance to what it is taught, measured
on sentences it never saw; STS-B dev stays a guard against damage.
"""

from __future__ import annotations

import hashlib
import random as _random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sentcl.data.domain import write_sentences
from sentcl.model.teacher import TeacherVectors
from sentcl.params import ParamsError, read_section, real_number, whole_number
from sentcl.training.objectives.distill import nearest_neighbours

AGREEMENT_FILE = (
    "agreement.tsv"  # in the teacher stage's output: the label-free dev set of a retrain (--heldout)
)
# method: what trains; transfer: what a retrain's runs train with over params ``transfer:`` (its distill steps);
# the rest: the held-out share that selects and gates without labels (AgreementConfig)
RETRAIN_KEYS = (
    "method",
    "heldout_share",
    "heldout_max",
    "agreement_neighbours",
    "agreement_random",
    "transfer",
)


@dataclass(frozen=True)
class AgreementConfig:
    """params.yaml ``retrain:``'s held-out share and how its pairs are drawn."""

    heldout_share: float  # share of a domain text's unique sentences set aside, never trained on
    heldout_max: int  # at most this many held out
    agreement_neighbours: int  # teacher neighbours of each held-out sentence
    agreement_random: int  # random partners of each held-out sentence

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> AgreementConfig:
        section = read_section(params, "retrain", RETRAIN_KEYS)
        share = section["heldout_share"]
        if real_number(share, "retrain.heldout_share", above=0) >= 1:
            raise ParamsError(
                f"params.yaml: retrain.heldout_share must be below 1 (the rest trains), got {share!r}"
            )
        return cls(
            float(share),
            whole_number(section["heldout_max"], "retrain.heldout_max", minimum=20),
            whole_number(section["agreement_neighbours"], "retrain.agreement_neighbours", minimum=1),
            whole_number(section["agreement_random"], "retrain.agreement_random", minimum=0),
        )


def hold_out(sentences: Sequence[str], share: float, limit: int, seed: int) -> tuple[list[str], list[str]]:
    """``(train, held_out)``: each unique sentence is held out when a seeded hash of it falls in the first
    ``share`` of the hash range, so a sentence lands on the same side whatever else the text holds and in whatever
    order (a nightly text that grows keeps yesterday's held-out sentences held out); at most ``limit`` are held
    out (the lowest hashes). The training text keeps the original order. Nothing is held out of fewer than 20
    sentences: too few pairs to rank checkpoints by."""
    unique = list(dict.fromkeys(sentences))
    if not 0 < share < 1 or len(unique) < 20:
        return unique, []
    unit = {
        s: int.from_bytes(hashlib.sha256(f"{seed}\t{s}".encode()).digest()[:8], "big") / 2**64 for s in unique
    }
    chosen = sorted((s for s in unique if unit[s] < share), key=unit.__getitem__)[:limit]
    held = set(chosen)
    return [s for s in unique if s not in held], sorted(held)


def agreement_pairs(
    sentences: Sequence[str], vectors: np.ndarray, neighbours: int, random: int, seed: int
) -> list[tuple[str, str, float]]:
    """Pairs among ``sentences`` (each with its ``neighbours`` nearest under the teacher and ``random`` others),
    each once whatever its order, with the teacher's cosine as the score; sorted, so the file is stable."""
    sentences = list(sentences)
    n = len(sentences)
    x = np.asarray(vectors, dtype=np.float64)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    found: set[tuple[int, int]] = set()
    k = min(neighbours, n - 1)
    if k >= 1:
        for i, row in enumerate(nearest_neighbours(x, k)):
            found |= {(min(i, int(j)), max(i, int(j))) for j in row}
    rng = _random.Random(seed)
    for i in range(n):
        others = [j for j in rng.sample(range(n), min(n, random + 1)) if j != i][:random]
        found |= {(min(i, j), max(i, j)) for j in others}
    return sorted((sentences[i], sentences[j], float(x[i] @ x[j])) for i, j in found)


def hold_out_file(
    texts: Path, train: Path, heldout: Path, config: AgreementConfig, seed: int
) -> tuple[int, int]:
    """Set the held-out share of the text file ``texts`` aside before anything reads it: ``train`` (``texts``
    itself, or another file) gets the rest (what the teacher encodes and the student trains on), ``heldout`` the
    held-out sentences (removed when none: under 20 sentences). Returns (training sentences, held-out ones)."""
    sentences = texts.read_text(encoding="utf-8").splitlines()
    kept, held = hold_out(sentences, config.heldout_share, config.heldout_max, seed)
    write_sentences(kept, train)
    if held:
        write_sentences(held, heldout)
    else:
        heldout.unlink(missing_ok=True)
    return len(kept), len(held)


def agreement_lines(record: TeacherVectors, held: list[str], config: AgreementConfig, seed: int) -> list[str]:
    """``agreement.tsv``'s lines: pairs among the held-out sentences, each scored by the teacher's cosine of its
    stored (fp16) vectors; the record's meta says how many."""
    pairs = agreement_pairs(
        held, record.lookup(held), config.agreement_neighbours, config.agreement_random, seed
    )
    record.meta["agreement"] = {"heldout": len(held), "pairs": len(pairs), "file": AGREEMENT_FILE}
    return [f"{a}\t{b}\t{score:.6f}\n" for a, b, score in pairs]


def agreement_summary(pairs: Sequence[tuple[str, str, float]]) -> dict[str, Any]:
    """What a training record says of a selection on teacher agreement: the pairs and the held-out sentences
    they are built from (every held-out sentence is in at least one pair: it has at least one neighbour)."""
    sentences = {s for a, b, _ in pairs for s in (a, b)}
    return {
        "selected_on": "teacher_agreement",
        "agreement_pairs": len(pairs),
        "heldout_sentences": len(sentences),
    }
