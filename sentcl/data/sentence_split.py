"""A domain built from one scored corpus by splitting its sentences, not its pairs (bench-domain's SICK default).

Splitting pairs leaves most test sentences in the training text (SICK's test pairs reuse its train sentences), so
a gain there is mostly on sentences the model trained on. Splitting the sentences instead gives a text half to
train on and a rest no run reads: each test pair is then seen (both sentences in the text), unseen (neither) or
mixed, and each part reports its own gain (``sentcl.evaluation.seen``). Dev pairs for selection are scored
pairs with both sentences in the text half that are not test pairs.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence

Pair = tuple[str, str, float]


def split_sentences(sentences: Iterable[str], seed: int) -> tuple[list[str], list[str]]:
    """``(text, rest)``: the unique sentences, sorted then shuffled with ``seed``, cut in two halves (the text
    gets the extra one of an odd count); each half sorted, so the files are stable."""
    unique = sorted(set(sentences))
    random.Random(seed).shuffle(unique)
    cut = (len(unique) + 1) // 2
    return sorted(unique[:cut]), sorted(unique[cut:])


def draw_dev_pairs(
    candidates: Sequence[Pair], text: Iterable[str], exclude: Iterable[Pair], limit: int, seed: int
) -> list[Pair]:
    """Up to ``limit`` of ``candidates`` whose two sentences are both in ``text`` and which are not in
    ``exclude`` (the test pairs, compared by their two sentences in either order), each sentence pair once; a
    seeded sample when there are more, in the candidates' order."""
    inside = set(text)
    banned = {frozenset((a, b)) for a, b, _ in exclude}
    eligible, taken = [], set()
    for a, b, score in candidates:
        key = frozenset((a, b))
        if a in inside and b in inside and key not in banned and key not in taken:
            taken.add(key)
            eligible.append((a, b, float(score)))
    if len(eligible) <= limit:
        return eligible
    keep = set(random.Random(seed).sample(range(len(eligible)), limit))
    return [pair for i, pair in enumerate(eligible) if i in keep]
