"""Selecting and gating a retrain without labels: a held-out share of the domain text, scored by the teacher.

A retrain's inbox has no scored pairs, and STS-B dev does not contain the team's domain. So a share of the domain
text is set aside before the teacher stage and never trained on; pairs are built among those held-out sentences
the way augmented SBERT samples unlabelled pairs (Thakur et al., 2021): each sentence with its ``neighbours``
nearest sentences under the teacher (sentence-transformers examples/training/data_augmentation/
train_sts_indomain_semantic.py: ``util.semantic_search(..., top_k)`` over the unlabelled sentences) and with
``random`` sentences drawn at random (the paper's random sampling, which keeps dissimilar pairs in the set).
The teacher's cosine is each pair's score. A checkpoint's agreement is the Spearman of its cosines with the
teacher's on these pairs: the student's distance to what it is taught, measured on sentences it never saw; STS-B
dev stays a guard against damage.

Selection and the gate judge on different sentences: the held-out sentences are split in two parts before any
pair is built (``split_heldout``), a *selection* part (the transfer stage picks its checkpoint there) and a *gate*
part (the gate compares challenger and champion there), and pairs are built within each part. No sentence is in
both (by the project's one rule of "the same sentence", ``sentcl.data.roles.normalise``), so the gate's domain
verdict comes from pairs selection never read.
"""

from __future__ import annotations

import hashlib
import random as _random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sentcl.data.domain import write_sentences
from sentcl.data.roles import normalise
from sentcl.model.teacher import TeacherVectors
from sentcl.params import ParamsError, read_section, real_number, whole_number
from sentcl.training.objectives.distill import nearest_neighbours

# The two parts of the held-out sentences: who reads each one's pairs.
PARTS = ("selection", "gate")
# In the teacher stage's output, by part (--heldout PART=FILE): the teacher-scored pairs within that part.
AGREEMENT_FILES = {part: f"agreement-{part}.tsv" for part in PARTS}
MIN_TEXT = 20  # nothing is held out of fewer sentences: too few pairs to rank checkpoints by
MIN_PART = 5  # sentences (keys) each part keeps at least: a few pairs to rank by; with fewer, no gate part
# method: what trains; transfer: what a retrain's runs train with over params ``transfer:`` (its distill steps);
# the rest: the held-out share that selects and gates without labels (AgreementConfig)
RETRAIN_KEYS = (
    "method",
    "heldout_share",
    "heldout_max",
    "gate_share",
    "agreement_neighbours",
    "agreement_random",
    "transfer",
)


@dataclass(frozen=True)
class AgreementConfig:
    """params.yaml ``retrain:``'s held-out share and how its pairs are drawn."""

    heldout_share: float  # share of a domain text's unique sentences set aside, never trained on
    heldout_max: int  # at most this many held out
    gate_share: float  # share of the held-out sentences the gate judges on; selection reads the rest
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
        gate = section["gate_share"]
        if real_number(gate, "retrain.gate_share", above=0) >= 1:
            raise ParamsError(
                f"params.yaml: retrain.gate_share must be below 1 (the rest selects), got {gate!r}"
            )
        return cls(
            float(share),
            whole_number(section["heldout_max"], "retrain.heldout_max", minimum=MIN_TEXT),
            float(gate),
            whole_number(section["agreement_neighbours"], "retrain.agreement_neighbours", minimum=1),
            whole_number(section["agreement_random"], "retrain.agreement_random", minimum=0),
        )


def _unit(seed: int, key: str, salt: str = "") -> float:
    """A seeded hash of a sentence's key in [0, 1): where the sentence falls, whatever else the text holds."""
    return int.from_bytes(hashlib.sha256(f"{seed}\t{salt}{key}".encode()).digest()[:8], "big") / 2**64


def hold_out(sentences: Sequence[str], share: float, limit: int, seed: int) -> tuple[list[str], list[str]]:
    """``(train, held_out)``: a sentence is held out when a seeded hash of its key (``normalise``: every variant
    of one sentence lands on the same side) falls in the first ``share`` of the hash range, so it lands on the
    same side whatever else the text holds and in whatever order (a nightly text that grows keeps yesterday's
    held-out sentences held out); at most ``limit`` are held out (the lowest hashes, a key's variants together).
    The training text keeps the original order. Nothing is held out of fewer than ``MIN_TEXT`` sentences: too
    few pairs to rank checkpoints by."""
    unique = list(dict.fromkeys(sentences))
    if not 0 < share < 1 or len(unique) < MIN_TEXT:
        return unique, []
    keys = {s: normalise(s) for s in unique}
    variants = Counter(keys.values())
    unit = {key: _unit(seed, key) for key in variants}
    held_keys: set[str] = set()
    count = 0
    for key in sorted((k for k in unit if unit[k] < share), key=lambda k: (unit[k], k)):
        if count + variants[key] > limit:
            break
        held_keys.add(key)
        count += variants[key]
    return [s for s in unique if keys[s] not in held_keys], sorted(s for s in unique if keys[s] in held_keys)


def split_heldout(held: Sequence[str], gate_share: float, seed: int) -> tuple[list[str], list[str]]:
    """``(selection, gate)``: the held-out sentences in two parts, no sentence in both by ``normalise`` (a key's
    variants go together). A key goes to the gate when a second seeded hash of it falls in the first
    ``gate_share`` of the range (stable as the text grows, like ``hold_out``), each part keeping at least
    ``MIN_PART`` keys (the lowest hashes move over); with fewer than ``2 * MIN_PART`` keys the gate gets none."""
    keys = {s: normalise(s) for s in held}
    unit = {key: _unit(seed, key, "gate\t") for key in set(keys.values())}
    ranked = sorted(unit, key=lambda k: (unit[k], k))
    if len(ranked) < 2 * MIN_PART:
        return list(held), []
    wanted = sum(unit[k] < gate_share for k in ranked)
    gate_keys = set(ranked[: min(max(wanted, MIN_PART), len(ranked) - MIN_PART)])
    return [s for s in held if keys[s] not in gate_keys], [s for s in held if keys[s] in gate_keys]


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
    texts: Path, train: Path, parts: Mapping[str, Path], config: AgreementConfig, seed: int
) -> dict[str, int]:
    """Set the held-out share of the text file ``texts`` aside before anything reads it: ``train`` (``texts``
    itself, or another file) gets the rest (what the teacher encodes and the student trains on), ``parts``
    (``selection`` and ``gate``: a file each) the held-out sentences split by ``split_heldout`` (a part's file is
    removed when it has none). Returns how many sentences each got: ``trained_on``, ``selection``, ``gate``."""
    sentences = texts.read_text(encoding="utf-8").splitlines()
    kept, held = hold_out(sentences, config.heldout_share, config.heldout_max, seed)
    split = dict(zip(PARTS, split_heldout(held, config.gate_share, seed), strict=True))
    write_sentences(kept, train)
    for part, path in parts.items():
        if split[part]:
            write_sentences(split[part], path)
        else:
            path.unlink(missing_ok=True)
    return {"trained_on": len(kept), **{part: len(split[part]) for part in PARTS}}


def agreement_lines(
    record: TeacherVectors, held: list[str], config: AgreementConfig, seed: int, part: str
) -> list[str]:
    """``AGREEMENT_FILES[part]``'s lines: pairs among ``held`` (one part of the held-out sentences, so a pair
    never joins the two parts), each scored by the teacher's cosine of its stored (fp16) vectors; the record's
    meta says how many, by part."""
    pairs = agreement_pairs(
        held, record.lookup(held), config.agreement_neighbours, config.agreement_random, seed
    )
    found = {"heldout": len(held), "pairs": len(pairs), "file": AGREEMENT_FILES[part]}
    record.meta.setdefault("agreement", {})[part] = found
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
