"""The one rule of data roles (sentcl.data.roles): when two sentences are the same, which pairs select, and which
pairs are the unseen check; on hand-built tables whose answers are counted by hand."""

from __future__ import annotations

import pandas as pd
import pytest

from sentcl.data import roles


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("A man is walking in the rain", "a man is walking in the rain ."),
        ("the queen 's will .", "The queen's will"),  # SentEval's tokenised text against STS-B's raw text
        ("Crème brûlée", "creme brulee"),  # accents folded, as an uncased tokenizer folds them
        ("two  dogs\trun", "Two dogs run!"),
        ("he ca n't come .", "He can't come"),
        ("standard & poor 's 500 index < .spx >", "Standard & Poor's 500 index .SPX"),  # symbols go too
    ],
)
def test_the_same_sentence_in_other_case_punctuation_or_spacing(a, b):
    assert roles.normalise(a) == roles.normalise(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("a man is playing a guitar", "a man is playing a flute"),
        ("a man is playing guitar", "a man is playing a guitar"),
        ("the cat sat", "the cats sat"),
        ("ca n't stop", "can not stop"),
    ],
)
def test_different_words_stay_different_sentences(a, b):
    assert roles.normalise(a) != roles.normalise(b)


def test_a_pair_is_the_same_pair_in_either_order():
    assert roles.pair_key("A dog runs.", "a cat sleeps") == roles.pair_key("a cat sleeps .", "a dog runs")
    assert roles.pair_key("a", "b") != roles.pair_key("a", "c")


def _table(rows):
    return pd.DataFrame(rows, columns=["task", "split", "sentence1", "sentence2", "score"])


ROWS = [
    ("STS12", "test", "s1", "s2", 1.0),
    ("STS13", "test", "s3", "s4", 2.0),
    ("STSb", "test", "s5", "s6", 3.0),
    ("SICK-R", "test", "s7", "s8", 4.0),
    ("STSb", "dev", "S1.", "s2", 1.0),  # an STS12 test pair: the declared convention
    ("STSb", "dev", "s5", "s9", 2.0),  # shares a sentence only: no test pair
    ("SICK-R", "dev", "s8 !", "S7", 4.0),  # a SICK-R test pair in the other order: left out of selection
    ("SICK-R", "dev", "s7", "s10", 3.0),
    ("STSb", "train", "u1", "u2", 1.0),  # unseen: neither sentence read anywhere
    ("STSb", "train", "u3", "S9 .", 2.0),  # s9 is a dev sentence
    ("STSb", "train", "u4", "t1", 3.0),  # t1 is trained on
    ("STSb", "train", "u5", "u6", None),  # no score
    ("SICK-R", "train", "U7", "u8", 4.0),  # unseen
    ("SICK-R", "train", "u9", "s10", 5.0),  # s10 is a trial sentence
    ("STS14", "train", "u10", "u11", 1.0),  # not a source of the unseen check
]


def test_selection_sets_keep_stsb_dev_as_published_and_drop_sick_trial_test_pairs():
    sets = roles.selection_sets(_table(ROWS))
    assert sets == {
        "stsb_dev": [("S1.", "s2", 1.0), ("s5", "s9", 2.0)],
        "sick_trial": [("s7", "s10", 3.0)],
    }


def test_the_unseen_check_drops_a_pair_if_either_side_was_read():
    kept = roles.unseen_check(_table(ROWS), ["T1 ."])
    assert list(zip(kept.sentence1, kept.sentence2, strict=True)) == [("u1", "u2"), ("U7", "u8")]


def test_overlap_counts_by_string_and_by_the_rule():
    counts = roles.overlap_counts(_table(ROWS))
    # STS-B dev: ("S1.", "s2") is STS12's ("s1", "s2") by the rule only; nothing by string.
    assert counts["STSb dev"] == {
        "pairs": 2,
        "sts12_16_exact": 0,
        "sts12_16_normalised": 1,
        "test_exact": 0,
        "test_normalised": 1,
    }
    # SICK-R trial: ("s8 !", "S7") is SICK-R test's ("s7", "s8") by the rule, not an STS12-16 pair.
    assert counts["SICK-R dev"]["test_normalised"] == 1 and counts["SICK-R dev"]["sts12_16_normalised"] == 0
    assert counts["STSb test"] == {"pairs": 1, "sts12_16_exact": 0, "sts12_16_normalised": 0}


def test_violations_name_a_slipped_in_test_pair_and_a_read_unseen_sentence():
    pairs = _table(ROWS)
    sets = roles.selection_sets(pairs)
    unseen = roles.unseen_check(pairs, ["t1"])
    assert roles.role_violations(pairs, sets, unseen, ["t1"]) == []
    # STS-B dev may hold test pairs (declared); a tuning set may not, in any case or order.
    slipped = {**sets, "tuning": [("S4", "s3.", 2.0)]}
    (line,) = roles.role_violations(pairs, slipped, unseen, ["t1"])
    assert line.startswith("selection set tuning: 1 pair(s) are test pairs")
    lines = roles.role_violations(pairs, sets, [("u1", "u2"), ("x", "S3")], ["U1"])
    assert lines == [
        "unseen check: 1 sentence(s) are in a trained text, e.g. 'u1'",
        "unseen check: 1 sentence(s) are in an evaluated split, e.g. 'S3'",
    ]
