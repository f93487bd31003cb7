"""The transfer stage's built-in target texts, disjoint from the sentences used to select and to score a model,
as the model sees them: by the tokenizer's ids, not by string.

Two sentences that differ only in case, spacing or the spacing of punctuation ("the queen 's will ." and "the
queen's will.") are one input to an uncased WordPiece model. Dropping only exact string repeats would leave such
a sentence in the training text while its twin selects (STS-B dev) or scores (a test set) the checkpoint. Here a
training sentence is dropped when its token ids, cut at the length the model reads, equal those of any excluded
sentence: the relation "the model cannot tell them apart", whatever the tokenizer normalises.

``heldout``: the seven STS test sets' unique sentences, without any sentence token-identical to a sentence of a
dev split: STS-B dev (checkpoint selection) and SICK-R trial (the promotion gate's guard; SICK reuses sentences
across its splits, so 698 of its 924 unique trial sentences are SICK test sentences). Selection is then
independent of training; the test sets are the target text, as in ConSERT's protocol. ``inductive``: STS-B train, SICK train and the NLI sentences, without any sentence
token-identical to a sentence of any dev or test split (no evaluated sentence is trained on).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sentcl.data.senteval import TASKS

BATCH = 4096  # sentences per call of a fast tokenizer (it parallelises inside a call)


@dataclass(frozen=True)
class Selection:
    """The training sentences kept, and how many candidates were dropped as token-identical to an excluded one."""

    texts: list[str]
    candidates: int  # unique candidate sentences, before the token comparison
    dropped: int  # of those, token-identical to an excluded sentence


def token_keys(sentences: Sequence[str], tokenizer: Any, max_length: int) -> list[tuple[int, ...]]:
    """Each sentence's token ids as the model reads it: without special tokens, cut where the tokenizer cuts at
    ``max_length`` tokens with them (``Encoder.tokenize``: truncation at ``model.max_length``, [CLS] and [SEP]
    included). Batched through the (fast) tokenizer."""
    room = max_length - tokenizer.num_special_tokens_to_add(pair=False)
    if room < 1:
        raise ValueError(f"max_length {max_length} leaves no room for a sentence's tokens")
    keys: list[tuple[int, ...]] = []
    for start in range(0, len(sentences), BATCH):
        batch = list(sentences[start : start + BATCH])
        ids = tokenizer(batch, add_special_tokens=False, truncation=True, max_length=room, verbose=False)[
            "input_ids"
        ]
        keys.extend(tuple(row) for row in ids)
    return keys


def drop_token_identical(
    candidates: Iterable[str], excluded: Iterable[str], tokenizer: Any, max_length: int
) -> Selection:
    """The unique ``candidates`` (sorted: a stable order) whose token ids (:func:`token_keys`) equal those of no
    ``excluded`` sentence."""
    unique = sorted(set(candidates))
    banned = set(token_keys(sorted(set(excluded)), tokenizer, max_length))
    kept = [
        s
        for s, key in zip(unique, token_keys(unique, tokenizer, max_length), strict=True)
        if key not in banned
    ]
    return Selection(kept, len(unique), len(unique) - len(kept))


def heldout_texts(
    test_sentences: Iterable[str], dev_sentences: Iterable[str], tokenizer: Any, max_length: int
) -> Selection:
    """``transfer.texts: heldout``: the test sets' sentences, none token-identical to a dev-split sentence."""
    return drop_token_identical(test_sentences, dev_sentences, tokenizer, max_length)


def inductive_texts(
    train_sentences: Iterable[str], evaluated_sentences: Iterable[str], tokenizer: Any, max_length: int
) -> Selection:
    """``transfer.texts: inductive``: training-split sentences, none token-identical to a dev or test sentence."""
    return drop_token_identical(train_sentences, evaluated_sentences, tokenizer, max_length)


def pairs_within(candidates: Iterable[tuple[str, str]], texts: Iterable[str]) -> list[tuple[str, str]]:
    """The unique unlabeled pairs of ``candidates`` whose two sides are both training sentences (``texts``),
    sorted (a stable order): a pair with a side dropped as token-identical to an evaluated sentence is dropped
    with it. Scores are never read: the pairing itself is the signal (the teacher labels it)."""
    kept = set(texts)
    return sorted({(a, b) for a, b in candidates if a in kept and b in kept and a != b})




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
