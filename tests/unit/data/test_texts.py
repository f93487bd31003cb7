"""The transfer stage's built-in texts are disjoint from the evaluated sentences as the model sees them: no training
sentence has the token ids of an excluded one (sentcl.data.texts), on a tiny tokenizer and on the real data."""

from __future__ import annotations

from tests.paths import ROOT

import os
import time
from pathlib import Path

import pandas as pd
import pytest
from transformers import AutoTokenizer

from sentcl.data.texts import drop_token_identical, heldout_texts, token_keys
from sentcl.model.encoder import Encoder, resolve_model_path
from stages.training import transfer_texts
from tests.tiny import write_tiny_processed

# The SentEval mirror: SENTEVAL_MIRROR (as the fetch stage reads it), else ../shared/senteval beside the checkout.
SHARED = Path(
    os.environ.get("SENTEVAL_MIRROR") or ROOT.parent / "shared" / "senteval"
)


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


def model_inputs(sentences, folder, max_length):
    """What the model reads for each sentence: the encoder's own tokenization (special tokens, its truncation),
    pads removed. Independent of sentcl.texts.token_keys (another call, with special tokens)."""
    encoder = Encoder.from_pretrained(str(folder), max_length=max_length)
    batch = encoder.tokenize(list(sentences))
    return {
        tuple(ids[mask.bool()].tolist())
        for ids, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True)
    }


def test_case_spacing_and_punctuation_twins_are_dropped(tiny_tokenizer):
    """An uncased WordPiece model reads these as the dev sentence: a string comparison would keep every one."""
    dev = ["a man is playing guitar.", "two dogs on the street"]
    twins = ["A man is playing guitar .", "a  man is playing   guitar.", "Two Dogs on the street"]
    distinct = ["a man is playing guitar", "a woman is playing guitar.", "two dogs on the red street"]
    selection = heldout_texts(twins + distinct, dev, tiny_tokenizer, 32)
    assert selection.texts == sorted(distinct)
    assert (selection.candidates, selection.dropped) == (6, 3)


def test_truncation_at_max_length_counts(tiny_tokenizer, tiny_model):
    """Two sentences equal in the tokens the model reads (cut at max_length, [CLS] and [SEP] included) are one
    input, whatever follows the cut; one token less before the cut and they differ."""
    dev = ["a man is playing guitar on the street"]
    longer = "a man is playing guitar with a dog"  # the same first five words, then others
    # max_length 7 = [CLS] + 5 words + [SEP]: the model reads "a man is playing guitar" for both.
    assert heldout_texts([longer], dev, tiny_tokenizer, 7).texts == []
    assert model_inputs([longer], tiny_model, 7) == model_inputs(dev, tiny_model, 7)
    # max_length 8: the sixth word differs ("on" vs "with"), and so do the model's inputs.
    assert heldout_texts([longer], dev, tiny_tokenizer, 8).texts == [longer]
    assert model_inputs([longer], tiny_model, 8) != model_inputs(dev, tiny_model, 8)


def test_token_keys_leave_out_special_tokens_and_refuse_no_room(tiny_tokenizer):
    (key,) = token_keys(["a dog"], tiny_tokenizer, 32)
    assert key == tuple(tiny_tokenizer.convert_tokens_to_ids(["a", "dog"]))
    with pytest.raises(ValueError, match="no room"):
        token_keys(["a dog"], tiny_tokenizer, 2)


def test_repeats_collapse_and_the_order_is_stable(tiny_tokenizer):
    selection = drop_token_identical(["b dog", "a cat", "b dog"], [], tiny_tokenizer, 32)
    assert (selection.texts, selection.candidates, selection.dropped) == (["a cat", "b dog"], 2, 0)


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


def test_heldout_and_inductive_on_tiny_tables(tmp_path, tiny_model, tiny_tokenizer):
    pairs, nli = _with_twins(write_tiny_processed(tmp_path / "processed"))
    dev = set(pairs[pairs.split == "dev"][["sentence1", "sentence2"]].stack())  # STS-B dev and SICK-R trial
    evaluated = set(pairs[pairs.split != "train"][["sentence1", "sentence2"]].stack())
    heldout = transfer_texts("heldout", pairs, nli, tmp_path, tiny_tokenizer, 32)
    assert "A girl  riding horse ." not in heldout and "blue ball" in heldout  # SICK trial is a dev split too
    inductive = transfer_texts("inductive", pairs, nli, tmp_path, tiny_tokenizer, 32)
    # The twins are not dev strings, so a string comparison keeps them; the model cannot tell them apart.
    assert not model_inputs(heldout, tiny_model, 32) & model_inputs(dev, tiny_model, 32)
    assert not model_inputs(inductive, tiny_model, 32) & model_inputs(evaluated, tiny_model, 32)
    twin = pairs.sentence1.iloc[-3]
    assert twin not in heldout and twin not in inductive
    assert "walking dog" in heldout and "sitting cat" in inductive
    assert nli.premise.iloc[-1] not in inductive and "riding horse" in inductive
    # The rest is kept: every test sentence the model can tell from every dev sentence.
    tests = set(pairs[pairs.split == "test"][["sentence1", "sentence2"]].stack())
    dev_ids = model_inputs(dev, tiny_model, 32)
    assert set(heldout) == {s for s in tests if not model_inputs([s], tiny_model, 32) & dev_ids}


@pytest.mark.slow  # ~15-40 s: reads every SentEval file, tokenizes ~60,000 sentences three times
@pytest.mark.skipif(not (SHARED / "STS").is_dir(), reason="needs the SentEval mirror (SENTEVAL_MIRROR)")
def test_real_data_has_no_token_identical_overlap(capsys):
    """On SentEval's files and the bundled all-MiniLM-L6-v2 tokenizer at model.max_length 64: no heldout sentence
    reads as an STS-B dev or SICK-R trial sentence, no inductive one as a dev or test sentence. By string only,
    292 of the 2,909 unique STS-B dev sentences had a token-identical twin in the heldout text (counted when this
    was found), and 698 of SICK-R trial's 924 are SICK-R test sentences."""
    from sentcl.data.validation import load_tables

    start = time.perf_counter()
    pairs, nli, _ = load_tables(SHARED, [])
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("all-MiniLM-L6-v2"))

    def ids(sentences):  # as Encoder.tokenize calls the tokenizer, without padding
        return [tuple(r) for r in tokenizer(list(sentences), truncation=True, max_length=64)["input_ids"]]

    stsb_dev = set(pairs[(pairs.task == "STSb") & (pairs.split == "dev")][["sentence1", "sentence2"]].stack())
    sick_trial = set(
        pairs[(pairs.task == "SICK-R") & (pairs.split == "dev")][["sentence1", "sentence2"]].stack()
    )
    dev = stsb_dev | sick_trial
    evaluated = set(pairs[pairs.split != "train"][["sentence1", "sentence2"]].stack())
    tests = set(pairs[pairs.split == "test"][["sentence1", "sentence2"]].stack())
    heldout = transfer_texts("heldout", pairs, nli, SHARED, tokenizer, 64)
    inductive = transfer_texts("inductive", pairs, nli, SHARED, tokenizer, 64)
    assert not set(ids(heldout)) & set(ids(dev))
    assert not set(ids(inductive)) & set(ids(evaluated))
    # What the string comparison of STS-B dev alone (the earlier heldout) left in.
    by_string = tests - stsb_dev
    string_ids = set(ids(by_string))
    twins = sum(key in string_ids for key in ids(stsb_dev))
    assert (len(stsb_dev), twins) == (2909, 292)
    assert (len(sick_trial), len(sick_trial & tests)) == (924, 698)
    assert set(heldout) <= by_string - sick_trial
    train = set(
        pairs[pairs.task.isin(("STSb", "SICK-R")) & (pairs.split == "train")][
            ["sentence1", "sentence2"]
        ].stack()
    )
    train |= set(nli.premise) | set(nli.hypothesis)
    with capsys.disabled():
        print(
            f"\nheldout: {len(by_string)} sentences by string, {len(heldout)} by token ids; inductive: "
            f"{len(train - evaluated)} by string, {len(inductive)} by token ids; "
            f"{time.perf_counter() - start:.1f} s"
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
