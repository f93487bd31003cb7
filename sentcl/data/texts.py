"""The transfer stage's built-in target texts, kept apart from the sentences that select and score a model by
the project's one rule of "same sentence" (``sentcl.data.roles.normalise``: case, accents, punctuation and spaces
ignored).

Two sentences that differ only in case, spacing or punctuation ("the queen 's will ." and "The queen's will") are
one sentence to the rule, and nearly one input to an uncased model. Dropping only exact string repeats would leave
such a sentence in the training text while its twin selects (STS-B dev) or scores (a test set) the checkpoint.
The text also holds each sentence once: of several twins inside it, the first in sorted order stays (a twin
would otherwise be a sentence's own nearest neighbour, and a step spent on one sentence twice).

``heldout``: the seven STS test sets' unique sentences, without any sentence that is a sentence of a dev split:
STS-B dev (checkpoint selection) and SICK-R trial (the promotion gate's guard; SICK reuses sentences across its
splits). Selection is then independent of training; the test sets are the target text, as in ConSERT's protocol.
``inductive``: STS-B train, SICK train and the NLI sentences, without any sentence of any dev or test split (no
evaluated sentence is trained on).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sentcl.data.roles import normalise, sentence_keys
from sentcl.data.senteval import TASKS


@dataclass(frozen=True)
class Selection:
    """The training sentences kept, and how many candidates were dropped as a sentence of an excluded text or as a
    twin of a kept one."""

    texts: list[str]
    candidates: int  # unique candidate strings
    dropped: int  # of those, the same sentence as an excluded one
    twins: int = 0  # of those, the same sentence as a kept one (its twin stays)


def drop_same_sentences(candidates: Iterable[str], excluded: Iterable[str]) -> Selection:
    """The unique ``candidates`` (sorted: a stable order), one per sentence (``normalise`` key), none the same
    sentence as an ``excluded`` one."""
    unique = sorted(set(candidates))
    banned = sentence_keys(excluded)
    kept: dict[str, str] = {}
    dropped = 0
    for sentence in unique:
        key = normalise(sentence)
        if key in banned:
            dropped += 1
        else:
            kept.setdefault(key, sentence)
    return Selection(list(kept.values()), len(unique), dropped, len(unique) - dropped - len(kept))


def heldout_texts(test_sentences: Iterable[str], dev_sentences: Iterable[str]) -> Selection:
    """``transfer.texts: heldout``: the test sets' sentences, none the same sentence as a dev-split one."""
    return drop_same_sentences(test_sentences, dev_sentences)


def inductive_texts(train_sentences: Iterable[str], evaluated_sentences: Iterable[str]) -> Selection:
    """``transfer.texts: inductive``: training-split sentences, none the same sentence as a dev or test one."""
    return drop_same_sentences(train_sentences, evaluated_sentences)


def pairs_within(candidates: Iterable[tuple[str, str]], texts: Iterable[str]) -> list[tuple[str, str]]:
    """The unique unlabeled pairs of ``candidates`` whose two sides are both training sentences (``texts``, by
    the ``normalise`` rule: a side is replaced by its twin in the text), sorted (a stable order): a pair with a
    side dropped as an evaluated sentence is dropped with it. Scores are never read: the pairing itself is the
    signal (the teacher labels it)."""
    kept = {normalise(s): s for s in texts}
    found = set()
    for a, b in candidates:
        ka, kb = normalise(a), normalise(b)
        if ka in kept and kb in kept and ka != kb:
            found.add((kept[ka], kept[kb]))
    return sorted(found)


def text_pairs(choice: str, pairs: Any, nli: Any, texts: Iterable[str]) -> list[tuple[str, str]]:
    """The unlabeled pairs a built-in text's sentences come in (``distill.examples: pairs``), both sides kept in
    ``texts``: heldout, the seven test sets' pairs (transductive, like the text itself); inductive, STS-B train,
    SICK train and the NLI premise/hypothesis pairs; consert, every STS/SICK pair. ``pairs`` and ``nli`` are the
    processed tables (columns task, split, sentence1, sentence2; premise, hypothesis). A text file has no pairs."""
    if choice == "heldout":
        frame = pairs[pairs.task.isin(TASKS) & (pairs.split == "test")]
        candidates = list(zip(frame.sentence1, frame.sentence2, strict=True))
    elif choice == "inductive":
        frame = pairs[pairs.task.isin(("STSb", "SICK-R")) & (pairs.split == "train")]
        candidates = list(zip(frame.sentence1, frame.sentence2, strict=True))
        candidates += list(zip(nli.premise, nli.hypothesis, strict=True))
    elif choice == "consert":
        candidates = list(zip(pairs.sentence1, pairs.sentence2, strict=True))
    else:
        raise ValueError(f"the text {choice!r} comes without pairs (use neighbours)")
    found = pairs_within(candidates, texts)
    if not found:
        raise ValueError(f"no pair of the {choice} text has both sides in the training text")
    return found
