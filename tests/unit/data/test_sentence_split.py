"""bench-domain's default domain: SICK split by sentence, dev pairs drawn inside the text half."""

from __future__ import annotations

import pandas as pd

from sentcl.data.sentence_split import draw_dev_pairs, split_sentences


def test_split_sentences_cuts_the_unique_sentences_in_two_seeded_halves():
    sentences = ["e", "a", "b", "c", "d", "a", "b"]  # 5 unique
    text, rest = split_sentences(sentences, seed=3)
    assert len(text) == 3 and len(rest) == 2  # the text half gets the odd one
    assert set(text) | set(rest) == {"a", "b", "c", "d", "e"} and not set(text) & set(rest)
    assert text == sorted(text) and rest == sorted(rest)
    assert split_sentences(reversed(sentences), seed=3) == (text, rest)  # input order does not matter
    many = [f"s{i}" for i in range(40)]
    halves = {tuple(split_sentences(many, seed)[0]) for seed in range(5)}
    assert len(halves) > 1  # the seed matters
    assert [len(h) for h in split_sentences(many, 0)] == [20, 20]


def test_dev_pairs_are_inside_the_text_not_test_pairs_and_each_once():
    text = ["a", "b", "c"]
    candidates = [
        ("a", "b", 1.0),  # in
        ("a", "d", 2.0),  # d is not in the text
        ("b", "a", 3.0),  # the same sentence pair again, reversed: once
        ("b", "c", 4.0),  # a test pair (reversed there)
        ("a", "c", 5.0),  # in
    ]
    test = [("c", "b", 0.5)]
    assert draw_dev_pairs(candidates, text, test, limit=10, seed=0) == [("a", "b", 1.0), ("a", "c", 5.0)]
    one = draw_dev_pairs(candidates, text, test, limit=1, seed=0)
    assert len(one) == 1 and one[0] in [("a", "b", 1.0), ("a", "c", 5.0)]
    assert draw_dev_pairs(candidates, text, test, limit=1, seed=0) == one  # seeded


def test_sick_split_takes_text_dev_and_test_from_sick_only():
    from benchmarks.bench_domain import sick_split

    rows = [("SICK-R", "train", f"t{i}", f"t{i + 1}", float(i % 5)) for i in range(30)]  # t0..t30
    rows += [("SICK-R", "dev", "t0", "t2", 4.0), ("SICK-R", "test", "u1", "t3", 2.0)]
    rows += [("SICK-R", "test", "t4", "t5", 3.0), ("STSb", "train", "zzz", "yyy", 0.0)]
    frame = pd.DataFrame(rows, columns=["task", "split", "sentence1", "sentence2", "score"])
    text, dev, test = sick_split(frame, seed=1, limit=500)
    assert len(text) == 16  # 32 SICK sentences (t0..t30 and u1), one half; no STS-B sentence
    assert "zzz" not in text and "yyy" not in text
    assert test == [("u1", "t3", 2.0), ("t4", "t5", 3.0)]
    inside = set(text)
    assert dev and all(a in inside and b in inside for a, b, _ in dev)
    assert ("t4", "t5") not in {(a, b) for a, b, _ in dev}  # test pairs never (t4-t5 is also a train pair)
    expected = [(a, b, s) for _, split, a, b, s in rows[:31] if a in inside and b in inside]
    expected = [p for p in expected if (p[0], p[1]) != ("t4", "t5")]
    assert sorted(dev) == sorted(expected)
    assert len(sick_split(frame, seed=1, limit=2)[1]) == min(2, len(expected))
