"""Which scored pairs play which role, and when two sentences are the same: the one rule every part of the
project decides overlap by (evaluation's seen/unseen split, the training text, tuning, the benchmarks, a retrain).

**Same sentence.** Two sentences are the same when their :func:`normalise` keys are equal: lower-cased (accents
folded, as an uncased WordPiece tokenizer folds them), punctuation (and symbols) dropped, spaces collapsed away. "A man is walking in
the rain" and "a man is walking in the rain ." are one sentence; so are SentEval's tokenised "the queen 's will ."
and STS-B's "The queen's will.". Two pairs are the same when their two sentences are, in either order.

**Roles**, on the validate stage's pairs table (``data/processed/pairs.parquet``: columns task, split, sentence1,
sentence2, score):

- **test**: the seven tasks' test splits (STS12-16, STS-B test, SICK-R test). Read once per recipe, after the
  choice; never to choose.
- **selection**: STS-B dev and SICK-R trial, what checkpoint selection, tuning and the promotion gate read (a
  retrain adds its domain's dev pairs). STS-B was assembled from the STS 2012-2016 data, so most STS-B dev pairs
  *are* test pairs (of STS12-16, and a few of STS-B test and SICK-R test): selecting on STS-B dev as published
  anyway is the field's convention (SimCSE, ConSERT), declared here (``DECLARED``) and counted by
  :func:`overlap_counts`. SICK-R trial has no such convention: its pairs that are test pairs are left out of
  selection (:func:`selection_sets`).
- **unseen check**: the scored STS-B train and SICK-R train pairs none of whose sentences is in any text a stage
  trained on or any evaluated split (test and selection) holds (:func:`unseen_check`): what a model learned that
  carries to new sentences. Read once per recipe, after the choice.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache
from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd

from sentcl.data.senteval import TASKS

STS_YEARS = ("STS12", "STS13", "STS14", "STS15", "STS16")
# (task, split) of the selection sets, by their role name.
SELECTION = {"stsb_dev": ("STSb", "dev"), "sick_trial": ("SICK-R", "dev")}
# The one declared exception: STS-B dev as published, test pairs and all (the field's selection convention).
DECLARED = ("stsb_dev",)
UNSEEN_SOURCES = (("STSb", "train"), ("SICK-R", "train"))  # the scored pairs no evaluation reads

Pair = tuple[str, str]
ScoredPairs = list[tuple[str, str, float]]


@lru_cache(maxsize=1 << 17)  # the evaluated sets repeat their sentences across calls: each is keyed once
def normalise(sentence: str) -> str:
    """The key "same sentence" is decided by: accents folded (NFKD, combining marks dropped), case-folded,
    punctuation and symbols dropped (Unicode categories P* and S*: BERT's tokenizer splits both off as
    punctuation, ``<``, ``&`` and ``$`` among them), and whitespace collapsed away entirely, so that a tokenised
    text and a raw one agree ("the queen 's will ." and "The queen's will"; "ca n't" and "can't")."""
    decomposed = unicodedata.normalize("NFKD", sentence).casefold()
    return "".join(
        c
        for c in decomposed
        if unicodedata.category(c)[0] not in "PSZ" and unicodedata.category(c) != "Mn" and not c.isspace()
    )


def sentence_keys(sentences: Iterable[str]) -> frozenset[str]:
    return frozenset(normalise(s) for s in sentences)


def pair_key(sentence1: str, sentence2: str) -> Pair:
    """A pair's key: its two sentences' keys, in either order."""
    a, b = normalise(sentence1), normalise(sentence2)
    return (a, b) if a <= b else (b, a)


def pair_keys(pairs: Iterable[Sequence[Any]]) -> frozenset[Pair]:
    """The keys of ``(sentence1, sentence2, ...)`` rows."""
    return frozenset(pair_key(p[0], p[1]) for p in pairs)


def rows(frame: pd.DataFrame) -> ScoredPairs:
    """A pairs table's rows as (sentence1, sentence2, score)."""
    return list(zip(frame.sentence1, frame.sentence2, frame.score.astype(float), strict=True))


def test_frame(pairs: pd.DataFrame, tasks: Sequence[str] = TASKS) -> pd.DataFrame:
    """The test role: the seven tasks' test splits (``tasks`` narrows it, e.g. to ``STS_YEARS``)."""
    return pairs[pairs.task.isin(tasks) & (pairs.split == "test")]


def test_pair_keys(pairs: pd.DataFrame, tasks: Sequence[str] = TASKS) -> frozenset[Pair]:
    frame = test_frame(pairs, tasks)
    return pair_keys(zip(frame.sentence1, frame.sentence2, strict=True))


def without_pairs(scored: Sequence[Sequence[Any]], banned: frozenset[Pair]) -> list[Any]:
    """``scored`` less the rows whose pair key is in ``banned``, order kept."""
    return [p for p in scored if pair_key(p[0], p[1]) not in banned]


def selection_sets(pairs: pd.DataFrame) -> dict[str, ScoredPairs]:
    """The selection role: ``stsb_dev`` (STS-B dev as published: its test pairs are the declared convention) and ``sick_trial`` (SICK-R trial less its pairs that are test pairs of any of the seven tasks)."""
    dev = pairs[(pairs.task == "STSb") & (pairs.split == "dev")]
    trial = pairs[(pairs.task == "SICK-R") & (pairs.split == "dev")]
    return {"stsb_dev": rows(dev), "sick_trial": without_pairs(rows(trial), test_pair_keys(pairs))}


def evaluated_sentences(pairs: pd.DataFrame) -> list[str]:
    """Every sentence of every split that is not ``train``: the test and selection sets' sentences."""
    evaluated = pairs[pairs.split != "train"]
    return [*evaluated.sentence1, *evaluated.sentence2]


def unseen_check(pairs: pd.DataFrame, read_texts: Iterable[str]) -> pd.DataFrame:
    """The unseen-check role: the scored rows of ``UNSEEN_SOURCES`` neither of whose sentences is (by
    :func:`normalise`) a sentence of an evaluated split (:func:`evaluated_sentences`) or of ``read_texts`` (every
    text any stage trained on or selected with). A pair repeated in the table is kept as often as it occurs."""
    excluded = sentence_keys([*evaluated_sentences(pairs), *read_texts])
    source = pd.Series(False, index=pairs.index)
    for task, split in UNSEEN_SOURCES:
        source |= (pairs.task == task) & (pairs.split == split)
    candidates = pairs[source & pairs.score.notna()]
    kept = [
        normalise(a) not in excluded and normalise(b) not in excluded
        for a, b in zip(candidates.sentence1, candidates.sentence2, strict=True)
    ]
    return candidates[pd.Series(kept, index=candidates.index, dtype=bool)]


def _string_key(sentence1: str, sentence2: str) -> Pair:
    a, b = sentence1.strip(), sentence2.strip()
    return (a, b) if a <= b else (b, a)


def overlap_counts(pairs: pd.DataFrame) -> dict[str, dict[str, int]]:
    """How many pairs of each split that is not a test split (and of STS-B test) are test pairs, exactly (the
    strings as the tables hold them, either order) and by :func:`normalise`: against the STS12-16 test pairs
    (``sts12_16_*``) and against every other test split of the seven tasks (``test_*``)."""
    years = test_frame(pairs, STS_YEARS)
    counts = {}
    for (task, split), frame in pairs.groupby(["task", "split"], sort=True):
        if split == "test" and task != "STSb":
            continue
        row = {"pairs": len(frame)}
        targets = {"sts12_16": years} | ({} if split == "test" else {"test": test_frame(pairs)})
        for name, target in targets.items():
            for how, key in (("exact", _string_key), ("normalised", pair_key)):
                banned = {key(a, b) for a, b in zip(target.sentence1, target.sentence2, strict=True)}
                row[f"{name}_{how}"] = sum(
                    key(a, b) in banned for a, b in zip(frame.sentence1, frame.sentence2, strict=True)
                )
        counts[f"{task} {split}"] = row
    return counts


def role_violations(
    pairs: pd.DataFrame,
    selection: dict[str, Sequence[Sequence[Any]]],
    unseen: pd.DataFrame | Sequence[Sequence[Any]],
    trained_texts: Iterable[str],
) -> list[str]:
    """Every breach of the roles, one line each (empty: the roles hold):

    - a selection (or tuning) pair that is a test pair, beyond the declared STS-B dev convention (``DECLARED``);
    - an unseen-check sentence that is a sentence of a trained text or of an evaluated split."""
    found = []
    tests = test_pair_keys(pairs)
    for name, scored in selection.items():
        hits = [p for p in scored if name not in DECLARED and pair_key(p[0], p[1]) in tests]
        if hits:
            found.append(
                f"selection set {name}: {len(hits)} pair(s) are test pairs, e.g. {hits[0][0]!r} / {hits[0][1]!r}"
            )
    if isinstance(unseen, pd.DataFrame):
        unseen = list(zip(unseen.sentence1, unseen.sentence2, strict=True))
    trained, evaluated = sentence_keys(trained_texts), sentence_keys(evaluated_sentences(pairs))
    for what, keys in (("a trained text", trained), ("an evaluated split", evaluated)):
        hits = [s for p in unseen for s in p[:2] if normalise(s) in keys]
        if hits:
            found.append(f"unseen check: {len(hits)} sentence(s) are in {what}, e.g. {hits[0]!r}")
    return found
