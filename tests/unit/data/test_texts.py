"""The transfer stage's built-in texts are disjoint from the evaluated sentences by the project's one rule of "same
sentence" (sentcl.data.roles.normalise): no training sentence is the same sentence as an excluded one, and the text
holds each sentence once (sentcl.data.texts), on hand-built tables and on the real data."""

from __future__ import annotations

import os
import time
import unicodedata
from pathlib import Path

import pandas as pd
import pytest

from sentcl.data.texts import drop_same_sentences, heldout_texts
from stages.training import transfer_texts
from tests.paths import ROOT
from tests.tiny import write_tiny_processed

# The SentEval mirror: SENTEVAL_MIRROR (as the fetch stage reads it), else ../shared/senteval beside the checkout.
SHARED = Path(os.environ.get("SENTEVAL_MIRROR") or ROOT.parent / "shared" / "senteval")


def key(sentence: str) -> str:
    """An independent transcription of the rule: ASCII-folded, lower-cased, letters and digits only (no spaces).
    It drops any non-ASCII letter the rule keeps, so it can only find more twins than the rule."""
    folded = unicodedata.normalize("NFKD", sentence).encode("ascii", "ignore").decode().lower()
    return "".join(c for c in folded if c.isalnum())


def test_case_spacing_and_punctuation_twins_are_dropped():
    """The dev sentence in other case, spacing or punctuation is the same sentence: a string comparison would
    keep every one."""
    dev = ["a man is playing guitar.", "two dogs on the street"]
    twins = ["A man is playing guitar .", "a  man is playing   guitar", "Two Dogs on the street!"]
    distinct = ["a man is playing a guitar", "a woman is playing guitar.", "two dogs on the red street"]
    selection = heldout_texts(twins + distinct, dev)
    assert selection.texts == sorted(distinct)
    assert (selection.candidates, selection.dropped, selection.twins) == (6, 3, 0)


def test_twins_inside_the_text_are_kept_once_and_the_order_is_stable():
    selection = drop_same_sentences(["b dog", "a cat", "b dog", "A cat.", "B Dog"], [])
    # sorted strings: "A cat.", "B Dog", "a cat", "b dog": the first of each sentence stays
    assert (selection.texts, selection.candidates, selection.dropped, selection.twins) == (
        ["A cat.", "B Dog"],
        4,
        0,
        2,
    )


def _with_twins(folder: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The tiny processed tables, plus rows that put an upper-case twin of a dev sentence among the test
    sentences and among STS-B train, a SICK-R trial pair whose sentence is also a SICK-R test sentence, and a
    spaced twin of a test sentence among the NLI sentences."""
    pairs = pd.read_parquet(folder / "pairs.parquet")
    nli = pd.read_parquet(folder / "nli.parquet")
    dev = pairs[(pairs.task == "STSb") & (pairs.split == "dev")].sentence1.iloc[0]
    test = pairs[(pairs.task == "STS12") & (pairs.split == "test")].sentence1.iloc[0]
    extra = pd.DataFrame(
        [
            ("STS12", "x", "test", dev.upper(), "walking dog", 1.0, "tiny", 99),
            ("STSb", "train", "train", dev.upper(), "sitting cat", 1.0, "tiny", 98),
            ("SICK-R", "trial", "dev", "a girl riding horse.", "red car", 3.0, "tiny", 96),
            ("SICK-R", "test", "test", "A girl  riding horse .", "blue ball", 3.0, "tiny", 95),
        ],
        columns=pairs.columns,
    )
    nli_extra = pd.DataFrame(
        [("SNLI", "dev", test.replace(" ", "  "), "riding horse", "neutral", "tiny", 97)], columns=nli.columns
    )
    return pd.concat([pairs, extra], ignore_index=True), pd.concat([nli, nli_extra], ignore_index=True)


def test_heldout_and_inductive_on_tiny_tables(tmp_path):
    pairs, nli = _with_twins(write_tiny_processed(tmp_path / "processed"))
    dev = set(pairs[pairs.split == "dev"][["sentence1", "sentence2"]].stack())  # STS-B dev and SICK-R trial
    evaluated = set(pairs[pairs.split != "train"][["sentence1", "sentence2"]].stack())
    heldout = transfer_texts("heldout", pairs, nli, tmp_path)
    assert "A girl  riding horse ." not in heldout and "blue ball" in heldout  # SICK trial is a dev split too
    inductive = transfer_texts("inductive", pairs, nli, tmp_path)
    # The twins are not dev strings, so a string comparison keeps them; the rule does not.
    assert not {key(s) for s in heldout} & {key(s) for s in dev}
    assert not {key(s) for s in inductive} & {key(s) for s in evaluated}
    twin = pairs.sentence1.iloc[-3]
    assert twin not in heldout and twin not in inductive
    assert "walking dog" in heldout and "sitting cat" in inductive
    assert nli.premise.iloc[-1] not in inductive and "riding horse" in inductive
    # The rest is kept, once per sentence: every test sentence that is no dev sentence.
    tests = set(pairs[pairs.split == "test"][["sentence1", "sentence2"]].stack())
    dev_keys = {key(s) for s in dev}
    assert {key(s) for s in heldout} == {key(s) for s in tests if key(s) not in dev_keys}
    assert len(heldout) == len({key(s) for s in heldout})


@pytest.mark.slow  # ~15-40 s: reads every SentEval file; tests/repo/test_data_roles.py holds the rule in make test
@pytest.mark.skipif(not (SHARED / "STS").is_dir(), reason="needs the SentEval mirror (SENTEVAL_MIRROR)")
def test_real_data_texts_hold_no_evaluated_sentence(capsys):
    """On SentEval's files: no heldout sentence is an STS-B dev or SICK-R trial sentence, no inductive one a dev
    or test sentence, by the rule (an independent transcription here, ``key``). By string only, 292 of the 2,909
    unique STS-B dev sentences had a twin in the heldout text (counted when this was found), and 698 of SICK-R
    trial's 924 are SICK-R test sentences."""
    from sentcl.data.validation import load_tables

    start = time.perf_counter()
    pairs, nli, _ = load_tables(SHARED, [])
    stsb_dev = set(pairs[(pairs.task == "STSb") & (pairs.split == "dev")][["sentence1", "sentence2"]].stack())
    sick_trial = set(
        pairs[(pairs.task == "SICK-R") & (pairs.split == "dev")][["sentence1", "sentence2"]].stack()
    )
    dev = stsb_dev | sick_trial
    evaluated = set(pairs[pairs.split != "train"][["sentence1", "sentence2"]].stack())
    tests = set(pairs[pairs.split == "test"][["sentence1", "sentence2"]].stack())
    heldout = transfer_texts("heldout", pairs, nli, SHARED)
    inductive = transfer_texts("inductive", pairs, nli, SHARED)
    assert not {key(s) for s in heldout} & {key(s) for s in dev}
    assert not {key(s) for s in inductive} & {key(s) for s in evaluated}
    by_string = tests - stsb_dev
    assert len(stsb_dev) == 2909 and (len(sick_trial), len(sick_trial & tests)) == (924, 698)
    assert sum(key(s) in {key(t) for t in by_string} for s in stsb_dev) >= 292
    assert set(heldout) <= by_string - sick_trial
    assert len(heldout) == len({key(s) for s in heldout})  # each sentence once
    with capsys.disabled():
        print(
            f"\nheldout: {len(by_string)} sentences by string, {len(heldout)} by the rule; inductive: "
            f"{len(inductive)}; {time.perf_counter() - start:.1f} s"
        )


def test_text_pairs_keep_only_pairs_whose_two_sides_are_training_sentences():
    from sentcl.data.texts import text_pairs

    pairs = pd.DataFrame(
        {
            "task": ["STS12", "STS12", "SICK-R", "STSb", "STSb", "SICK-R"],
            "split": ["test", "test", "test", "dev", "train", "train"],
            "sentence1": ["a cat", "a dog", "a man runs", "dev one", "train a", "sick a"],
            "sentence2": ["the cat", "dev two", "a man runs", "dev two", "train b", "sick b"],
            "score": [5.0, 1.0, 2.0, 3.0, 4.0, 0.0],
        }
    )
    nli = pd.DataFrame({"premise": ["p1", "p2"], "hypothesis": ["h1", "p2"]})
    texts = ["a cat", "the cat", "a dog", "a man runs", "train a", "train b", "sick a", "sick b", "p1", "h1"]
    # "a dog" / "dev two": its second side is not a training sentence; a pair of a sentence with itself says
    # nothing; a dev pair is never a heldout pair
    assert text_pairs("heldout", pairs, nli, texts) == [("a cat", "the cat")]
    assert text_pairs("inductive", pairs, nli, texts) == [
        ("p1", "h1"),
        ("sick a", "sick b"),
        ("train a", "train b"),
    ]
    with pytest.raises(ValueError, match="comes without pairs"):
        text_pairs("my-domain.txt", pairs, nli, texts)
    with pytest.raises(ValueError, match="no pair of the heldout text"):
        text_pairs("heldout", pairs, nli, ["a cat"])
