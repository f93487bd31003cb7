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


def test_news_split_keeps_sts_b_train_news_pairs_only_and_tests_on_the_rest(tmp_path):
    from benchmarks.bench_domain import news_split

    # sts-train.csv: genre in column 1; pairs.parquet rows point back at their line.
    genres = ["main-news", "main-captions", "main-news", "main-forum"] + ["main-news"] * 16
    csv = tmp_path / "STS" / "STSBenchmark" / "sts-train.csv"
    csv.parent.mkdir(parents=True)
    csv.write_text("".join(f"{g}\tx\t2012\t{i:04d}\t1.0\ta\tb\n" for i, g in enumerate(genres)))
    rows = [("STSb", "train", f"n{i}", f"n{i + 1}", float(i % 5), i + 1) for i in range(len(genres))]
    rows += [("STSb", "dev", "d1", "d2", 1.0, 1), ("SICK-R", "train", "s1", "s2", 2.0, 1)]
    frame = pd.DataFrame(rows, columns=["task", "split", "sentence1", "sentence2", "score", "line"])
    text, dev, test = news_split(frame, tmp_path, seed=3, limit=3)
    news = [(a, b, s) for (_, _, a, b, s, line), g in zip(rows, genres, strict=False) if g == "main-news"]
    assert len(news) == 18  # lines 2 and 4 are captions and forum
    assert set(text) <= {x for a, b, _ in news for x in (a, b)} and len(text) == 11  # half of 21 (n0-n3, n4-n20)
    assert len(dev) == 3 and all(a in text and b in text for a, b, _ in dev)
    assert sorted(dev + test) == sorted(news)  # every news pair once: dev or test
    assert ("n1", "n2", 1.0) not in dev + test and ("n3", "n4", 3.0) not in dev + test  # captions, forum
