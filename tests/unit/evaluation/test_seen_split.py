"""Scores split by what a checkpoint saw in training: the seen / unseen / mixed counts on hand-built pairs, the
lineage union (transfer-nli saw nli's text too), case-and-punctuation twins, and the unseen-STS filter."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from sentcl.evaluation import seen as seen_split
from sentcl.evaluation.benchmark import Benchmark, Subset
from sentcl.evaluation.models import CHECKPOINTS
from sentcl.evaluation.seen import pair_splits, seen_keys, split_scores, unseen_sts_subsets
from sentcl.training.data import example_sentences
from sentcl.training.recipes import checkpoint_lineage, training_stages
from tests.tiny import WORDS
from tests.unit.evaluation.test_sts_benchmark import make_tiny_model


def _sentences(n: int, start: int = 0) -> list[str]:
    """``n`` distinct lowercase sentences over the tiny vocabulary (three words each, by index)."""
    k = len(WORDS)
    return [
        f"{WORDS[i % k]} {WORDS[(i // k) % k]} {WORDS[(i // k // k) % k]}" for i in range(start, start + n)
    ]


def test_lineage_is_the_init_chain_and_covers_every_training_stage():
    assert checkpoint_lineage("base") == ()
    assert checkpoint_lineage("nli") == ("nli",)
    assert checkpoint_lineage("joint") == ("joint",)
    assert checkpoint_lineage("transfer-base") == ("transfer-base",)
    assert checkpoint_lineage("transfer-nli") == ("nli", "transfer-nli")
    assert checkpoint_lineage("transfer-joint") == ("joint", "transfer-joint")
    assert set(training_stages()) == {s for c in CHECKPOINTS for s in checkpoint_lineage(c)}
    with pytest.raises(ValueError, match="not a checkpoint"):
        checkpoint_lineage("transfer-custom")


def test_example_sentences_are_every_string_of_every_example_once():
    examples = ["b", ("a", "c", 2), ("c", "d", "e"), ("f",), "b"]
    assert example_sentences(examples) == ["a", "b", "c", "d", "e", "f"]


def test_split_counts_and_scores_on_hand_built_pairs():
    s = _sentences(200)
    # STS12: 40 pairs both seen, 35 neither, 5 with one side seen; STSb: 10 seen, 30 unseen.
    seen_text = s[0:80] + s[150:170]
    first = [*s[0:40], *s[80:115], *s[40:45]]
    second = [*s[40:80], *s[115:150], *s[120:125]]
    gold12 = np.arange(80.0)
    sts12 = Subset("STS12", "x", tuple(first), tuple(second), gold12)
    stsb = Subset(
        "STSb", "test", tuple(s[150:160] + s[170:200]), tuple(s[160:170] + s[170:200]), np.arange(40.0)
    )
    # Cosines: increasing with gold on the seen pairs, decreasing on the unseen ones (Spearman +100 / -100).
    cos12 = np.concatenate([np.arange(40.0), -np.arange(35.0), np.zeros(5)])
    cosb = np.concatenate([np.arange(10.0), -np.arange(30.0)])
    keys = seen_keys(seen_text)
    labels = pair_splits(sts12, keys)
    assert list(labels[:40]) == ["seen"] * 40 and list(labels[40:75]) == ["unseen"] * 35
    assert list(labels[75:]) == ["mixed"] * 5

    result = split_scores([sts12, stsb], [cos12, cosb], keys)
    t = result["tasks"]
    assert {k: v["pairs"] for k, v in t["STS12"].items()} == {"seen": 40, "unseen": 35, "mixed": 5}
    assert {k: v["pairs"] for k, v in t["STSb"].items()} == {"seen": 10, "unseen": 30, "mixed": 0}
    assert t["STS12"]["seen"]["spearman"] == pytest.approx(100.0)
    assert t["STS12"]["unseen"]["spearman"] == pytest.approx(-100.0)
    assert t["STS12"]["mixed"]["spearman"] is None  # 5 pairs: a count, no score
    assert t["STSb"]["seen"]["spearman"] is None  # 10 pairs
    assert t["STSb"]["unseen"]["spearman"] == pytest.approx(-100.0)
    assert result["avg"]["seen"] == {"spearman": pytest.approx(100.0), "tasks": 1, "pairs": 50}
    assert result["avg"]["unseen"] == {"spearman": pytest.approx(-100.0), "tasks": 2, "pairs": 65}
    assert result["avg"]["mixed"] == {"spearman": None, "tasks": 0, "pairs": 5}


def test_an_untrained_pair_with_a_sentence_selection_or_the_gate_read_is_not_unseen():
    """``read``: the keys of what a run's selection or gate read (a held-out part, dev pairs). A pair of no trained
    sentence that holds one is ``read``, not unseen, also when it differs in case and punctuation; a pair with a
    trained sentence stays mixed or seen whatever it read."""
    s = _sentences(12)
    first = (s[0], s[2], s[4], s[6], s[8])
    second = (s[1], s[3], s[5], s[7], s[9])
    subset = Subset("SICK-R", "test", first, second, np.arange(5.0))
    trained = seen_keys([s[0], s[1], s[2]])
    read = seen_keys([s[3].upper() + " .", s[4], s[5], s[7], s[11]])
    labels = list(pair_splits(subset, trained, read))
    assert labels == ["seen", "mixed", "read", "read", "unseen"]
    assert list(pair_splits(subset, trained)) == ["seen", "mixed", "unseen", "unseen", "unseen"]
    counts = split_scores([subset], [np.arange(5.0)], trained, read)["tasks"]["SICK-R"]
    assert {k: v["pairs"] for k, v in counts.items()} == {"seen": 1, "unseen": 1, "mixed": 1, "read": 2}


def _pairs_table(rows: list[tuple[str, str, str, str, float]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=["task", "split", "sentence1", "sentence2", "score"])
    frame["subset"], frame["source"], frame["line"] = frame["split"], "hand", range(1, len(frame) + 1)
    return frame


def test_unseen_sts_drops_a_pair_if_either_side_is_evaluated_or_trained_on():
    s = _sentences(30)
    rows = [
        (
            "STS12",
            "test",
            s[0],
            s[1],
            1.0,
        ),  # evaluated sentences: s0, s1 (test), s2, s3 (dev), s4, s5 (trial)
        ("STSb", "dev", s[2], s[3], 2.0),
        ("SICK-R", "trial", s[4], s[5], 3.0),
        ("STSb", "train", s[10], s[11], 1.0),  # kept: neither side excluded
        ("STSb", "train", s[12], s[11], 1.5),  # kept
        ("STSb", "train", s[0], s[13], 2.0),  # dropped: s0 is a test sentence
        ("STSb", "train", s[14], s[3], 2.0),  # dropped: s3 is an STS-B dev sentence
        ("STSb", "train", s[5], s[15], 2.0),  # dropped: s5 is a SICK trial sentence
        ("STSb", "train", s[20], s[16], 3.0),  # dropped: s20 is in a training text
        ("STSb", "train", s[17], s[21].upper() + " .", 3.0),  # dropped: a twin of the training text's s21
        ("STSb", "train", s[18], s[19], None),  # no score
        ("SICK-R", "train", s[22], s[23], 4.0),  # kept
        ("SICK-R", "train", s[24], s[1], 4.0),  # dropped: s1 is a test sentence
    ]
    pairs = _pairs_table(rows)
    kept = unseen_sts_subsets(pairs, [s[20], s[21]])
    assert [(x.task, len(x)) for x in kept] == [("STSb", 2), ("SICK-R", 1)]
    assert kept[0].sentences1 == (s[10], s[12]) and kept[1].sentences2 == (s[23],)
    assert list(kept[0].gold) == [1.0, 1.5]


def test_evaluate_stage_splits_each_checkpoint_by_its_lineage(tmp_path, monkeypatch):
    """40 STS12 pairs: 0-9 both sides in nli's text, 10-19 both in transfer-nli's, 20-29 one side in each,
    30-39 in neither; transfer-base trained on a case, spacing and punctuation twin of one side of pair 30."""
    import stages.evaluate as stage
    from tests.unit.evaluation.test_sts_benchmark import write_mini_senteval

    s = _sentences(160)
    first, second = s[0:40], s[40:80]
    nli_text = first[0:10] + second[0:10] + first[20:30]
    transfer_nli_text = first[10:20] + second[10:20] + second[20:30]
    seen = tmp_path / "seen"
    seen.mkdir()
    texts = {
        "nli": nli_text,
        "joint": [],
        "transfer-base": ["  " + first[30].upper() + " !"],
        "transfer-nli": transfer_nli_text,
        "transfer-joint": [],
    }
    for stage_name, lines in texts.items():
        (seen / f"{stage_name}.txt").write_text("".join(f"{x}\n" for x in lines))
    # The mini SentEval tree for the dev splits and the model; the STS12 subset is replaced by the hand-built one.
    raw = tmp_path / "raw"
    write_mini_senteval(raw)
    benchmark = stage.load_benchmark(raw)
    sts12 = Subset("STS12", "hand", tuple(first), tuple(second), np.arange(40.0))
    benchmark = Benchmark((sts12,), benchmark.dev, 0, benchmark.sick_dev)
    processed = tmp_path / "processed"
    processed.mkdir()
    rows = [("STS12", "test", a, b, 1.0) for a, b in zip(first, second, strict=True)]
    rows += [("STSb", "train", s[80 + i], s[120 + i], float(i)) for i in range(30)]
    _pairs_table(rows).to_parquet(processed / "pairs.parquet")
    bench, more_scores, files = stage.split_scoring(benchmark, list(CHECKPOINTS), processed, seen)
    assert [len(x) for x in bench.extra] == [30, 0]  # STS-B train: none of its sentences evaluated or trained
    assert sorted(p.name for p in files) == sorted(f"{n}.txt" for n in texts)
    cosines = {"subsets": [np.arange(40.0)], "extra": [np.arange(30.0), np.zeros(0)]}
    counts = {}
    for name in CHECKPOINTS:
        row = more_scores(name, cosines)
        counts[name] = {k: v["pairs"] for k, v in row["seen_split"]["tasks"]["STS12"].items()}
        assert row["unseen_sts"]["pairs"] == 30 and row["unseen_sts"]["spearman"] == pytest.approx(100.0)
    assert counts["base"] == {"seen": 0, "unseen": 40, "mixed": 0}
    assert counts["nli"] == {"seen": 10, "unseen": 20, "mixed": 10}
    assert counts["transfer-nli"] == {"seen": 30, "unseen": 10, "mixed": 0}  # nli's text and its own
    assert counts["transfer-base"] == {"seen": 0, "unseen": 39, "mixed": 1}  # the twin counts as seen
    assert counts["joint"] == counts["transfer-joint"] == {"seen": 0, "unseen": 40, "mixed": 0}

    # A gain is read on one set of pairs: base scored first (cosines against the gold order: -100), then
    # transfer-nli's 30 seen pairs (+100) carry the base's -100 on exactly those 30 pairs.
    extra = [np.arange(30.0), np.zeros(0)]
    base_row = more_scores("base", {"subsets": [-np.arange(40.0)], "extra": extra})
    assert seen_split.BASE_SAME_PAIRS not in base_row["seen_split"]
    row = more_scores("transfer-nli", {"subsets": [np.arange(40.0)], "extra": extra})
    same = row["seen_split"][seen_split.BASE_SAME_PAIRS]
    assert same["seen"]["pairs"] == 30 and same["seen"]["spearman"] == pytest.approx(-100.0)
    assert row["seen_split"]["avg"]["seen"]["spearman"] == pytest.approx(100.0)
    table = seen_split.split_markdown({"base": base_row, "transfer-nli": row})
    assert "| transfer-nli | 100.00 (30; base -100.00, +200.00) |" in table

    (seen / "joint.txt").unlink()
    with pytest.raises(stage.scoring.EvaluationSetupError, match="joint.txt is missing"):
        stage.split_scoring(benchmark, list(CHECKPOINTS), processed, seen)


def test_pipeline_stage_writes_the_split_tables_and_keeps_the_metrics_files(tmp_path, monkeypatch):
    """The whole stage on a tiny model: the new keys in sts.json and sts.md, the eval files' shape unchanged."""
    import stages.evaluate as stage
    from tests.unit.evaluation.test_sts_benchmark import write_mini_senteval

    raw = tmp_path / "raw"
    write_mini_senteval(raw)
    benchmark = stage.load_benchmark(raw)
    rows = [
        (part.task, "test" if part in benchmark.subsets else "dev", a, b, 1.0)
        for part in (*benchmark.subsets, *benchmark.dev_subsets)
        for a, b in zip(part.sentences1, part.sentences2, strict=True)
    ]
    fresh = _sentences(80, start=3000)  # three words each: never a mini tree sentence of another length
    rows += [("SICK-R", "train", fresh[i], fresh[40 + i], float(i % 5)) for i in range(40)]
    processed, seen, models = tmp_path / "processed", tmp_path / "seen", tmp_path / "models"
    processed.mkdir()
    _pairs_table(rows).to_parquet(processed / "pairs.parquet")
    seen.mkdir()
    for name in training_stages():
        (seen / f"{name}.txt").write_text("")
    (seen / "transfer-base.txt").write_text(f"{fresh[0]}\n")  # pair 0 of the unseen set goes
    model = make_tiny_model(tmp_path / "hub")
    for name in CHECKPOINTS:
        shutil.copytree(model, models / name)
    monkeypatch.setattr(stage, "MODELS", models)
    monkeypatch.setattr(stage, "METRICS", tmp_path / "metrics")
    monkeypatch.setattr(stage, "PROCESSED", processed)
    monkeypatch.setattr(stage, "SEEN", seen)
    monkeypatch.setenv("SENTCL_MLFLOW", "0")
    params = {"evaluate": {"backend": "torch"}, "model": {"max_length": 32}}
    stage.run_pipeline(params, raw, None, None)

    written = json.loads((tmp_path / "metrics" / "sts.json").read_text())
    for name in CHECKPOINTS:
        row = written[name]
        total = sum(len(p) for p in benchmark.subsets)
        assert row["seen_split"]["avg"]["unseen"]["pairs"] == total  # nothing of the tests was trained on
        assert (
            row["unseen_sts"]["pairs"] == 39 and row["unseen_sts"]["sources"]["SICK-R train"]["pairs"] == 39
        )
        assert set(json.loads((tmp_path / "metrics" / "eval" / f"{name}.json").read_text())) == {
            "avg",
            "stsb_dev",
            "sick_dev",
        }
    table = (tmp_path / "metrics" / "sts.md").read_text()
    assert "By what the checkpoint saw" in table and "| transfer-nli | mixed |" in table


def test_unseen_sts_score_weighs_sources_by_pairs_and_skips_small_ones():
    from sentcl.evaluation.seen import unseen_sts_scores

    def subset(task: str, n: int) -> Subset:
        s = _sentences(2 * n)
        return Subset(task, "train", tuple(s[:n]), tuple(s[n:]), np.arange(float(n)))

    parts = [subset("STSb", 60), subset("SICK-R", 30), subset("STS12", 10)]
    cosines = [np.arange(60.0), -np.arange(30.0), np.arange(10.0)]  # +100, -100, too few to score
    result = unseen_sts_scores(parts, cosines)
    assert result["pairs"] == 100 and result["sources"]["STS12 train"] == {"pairs": 10, "spearman": None}
    assert result["spearman"] == pytest.approx((60 * 100 - 30 * 100) / 90)
