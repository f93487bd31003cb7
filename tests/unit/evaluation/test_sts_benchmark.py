"""The STS benchmark: protocols on hand-made data, the standalone command on a tiny model, and the speed tricks
(dedup, length-sorted token-budget batches, ONNX Runtime) changing no number."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sentcl.data.senteval import STS_TASKS
from sentcl.evaluation.benchmark import (
    TASKS,
    Benchmark,
    Subset,
    evaluate,
    load_benchmark,
    markdown_table,
    protocol_scores,
)
from sentcl.evaluation.models import CHECKPOINTS
from sentcl.model.encoder import Encoder
from sentcl.model.fast_encode import FastEncoder
from sentcl.model.folder import model_max_length
from tests.paths import ROOT
from tests.tiny import make_tiny_encoder, tiny_vocab, write_tiny_processed

SHARED = ROOT.parent / "shared" / "senteval"
WORDS = "a man woman dog cat playing guitar eating food riding horse running street children ball red blue car".split()


def _sentence(rng: np.random.Generator) -> str:
    return " ".join(rng.choice(WORDS, size=int(rng.integers(2, 12))))


def write_mini_senteval(root: Path, pairs_per_subset: int = 6, seed: int = 0) -> dict[str, int]:
    """A SentEval-layout tree with every STS12-16 subset, STS-B dev/test and SICK trial/test, small and random.

    Each STS subset also gets one unscored line (empty gold), which the benchmark must skip; sentences repeat
    across subsets (a small vocabulary) so dedup has work to do. Returns {"skipped": .., "pairs": ..}.
    """
    rng = np.random.default_rng(seed)
    skipped = pairs = 0
    for _task, (folder, subsets) in STS_TASKS.items():
        target = root / "STS" / folder
        target.mkdir(parents=True, exist_ok=True)
        for subset in subsets:
            inputs, golds = [], []
            for i in range(pairs_per_subset + 1):
                inputs.append(f"{_sentence(rng)}\t{_sentence(rng)}")
                golds.append("" if i == 2 else f"{rng.uniform(0, 5):.3f}")
            (target / f"STS.input.{subset}.txt").write_text("\n".join(inputs) + "\n")
            (target / f"STS.gs.{subset}.txt").write_text("\n".join(golds) + "\n")
            skipped += 1
            pairs += pairs_per_subset
    stsb = root / "STS" / "STSBenchmark"
    stsb.mkdir(parents=True, exist_ok=True)
    for split in ("dev", "test"):
        lines = [
            f"main-captions\tMSRvid\t2012test\t{i:04d}\t{rng.uniform(0, 5):.2f}\t{_sentence(rng)}\t{_sentence(rng)}"
            for i in range(3 * pairs_per_subset)
        ]
        (stsb / f"sts-{split}.csv").write_text("\n".join(lines) + "\n")
    pairs += 3 * pairs_per_subset
    sick = root / "SICK"
    sick.mkdir(parents=True, exist_ok=True)
    for name in ("SICK_trial.txt", "SICK_test_annotated.txt"):
        lines = ["pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment"] + [
            f"{i}\t{_sentence(rng)}\t{_sentence(rng)}\t{rng.uniform(1, 5):.1f}\tNEUTRAL"
            for i in range(3 * pairs_per_subset)
        ]
        (sick / name).write_text("\n".join(lines) + "\n")
    pairs += 3 * pairs_per_subset
    return {"skipped": skipped, "pairs": pairs}


def make_tiny_model(tmp_path: Path) -> Path:
    """tests/tiny.py's model, with its tokenizer re-saved when it lost the vocabulary.

    transformers 5 ignores ``BertTokenizerFast(vocab_file=...)`` and keeps only the 5 special tokens, so every
    word became [UNK] and all sentences of a length got the same vector (Spearman then ranks float noise).
    """
    from transformers import AutoTokenizer, BertTokenizerFast

    folder = make_tiny_encoder(tmp_path, max_length=32)
    if len(AutoTokenizer.from_pretrained(folder)) < len(set(tiny_vocab())):
        BertTokenizerFast(vocab=str(folder / "vocab.txt"), do_lower_case=True).save_pretrained(folder)
    assert "[UNK]" not in AutoTokenizer.from_pretrained(folder).tokenize("a man is riding a horse")
    return folder


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def mini_data(tmp_path_factory) -> tuple[Path, dict[str, int]]:
    root = tmp_path_factory.mktemp("senteval")
    return root, write_mini_senteval(root)


def _subset(task: str, name: str, gold: list[float]) -> Subset:
    n = len(gold)
    return Subset(
        task, name, tuple(f"a{i}" for i in range(n)), tuple(f"b{i}" for i in range(n)), np.array(gold)
    )


def test_all_and_mean_protocols_on_a_hand_made_two_subset_task():
    # Task T: each subset alone is perfectly ranked (+100 each, so "mean" = 100), but the first subset's golds
    # sit above the second's while its cosines sit below. Concatenated, the cosine ranks are 1..6 and the gold
    # ranks 4 5 6 1 2 3: d = -3 -3 -3 3 3 3, sum d^2 = 54, rho = 1 - 6*54 / (6*35) = -114/210.
    subsets = [
        _subset("T", "first", [3, 4, 5]),
        _subset("T", "second", [0, 1, 2]),
        _subset("U", "only", [3, 1, 2]),
    ]
    sims = [np.array([0.1, 0.2, 0.3]), np.array([0.4, 0.5, 0.6]), np.array([0.9, 0.1, 0.5])]
    scores = protocol_scores(subsets, sims)
    assert scores["all"]["T"] == pytest.approx(-11400 / 210)
    assert scores["mean"]["T"] == pytest.approx(100.0)
    assert scores["subsets"] == pytest.approx({"T/first": 100.0, "T/second": 100.0, "U/only": 100.0})
    # A one-subset task is the same under both protocols; avg is the plain mean over tasks.
    assert scores["all"]["U"] == scores["mean"]["U"] == pytest.approx(100.0)
    assert scores["all"]["avg"] == pytest.approx((-11400 / 210 + 100) / 2)
    assert scores["mean"]["avg"] == pytest.approx(100.0)


def test_mean_protocol_averages_subsets_unweighted_by_size():
    # 2-pair subsets correlate +-100 whatever their values; sizes 2 and 4 must not weight the mean.
    subsets = [_subset("T", "small", [1, 2]), _subset("T", "large", [1, 2, 3, 4])]
    sims = [np.array([0.2, 0.1]), np.array([0.1, 0.2, 0.3, 0.4])]
    assert protocol_scores(subsets, sims)["mean"]["T"] == pytest.approx(0.0)


def test_dev_splits_are_scored_apart_from_the_seven_tasks():
    """Hand-made vectors: the STS-B dev pairs' cosines rank as their golds (+100), SICK trial's against them
    (-100), and neither enters the seven tasks' table or its average."""
    from sentcl.evaluation.benchmark import score_vectors

    angles = {"d0": 0.0, "d1": 0.5, "d2": 1.0, "s0": 0.0, "s1": 0.5, "s2": 1.0, "t0": 0.0, "t1": 0.3}
    vectors = np.array([[np.cos(a), np.sin(a)] for a in angles.values()])
    ref = "ref"  # every pair's second side: (1, 0), so a pair's cosine falls as its angle grows
    sentences, vectors = [*angles, ref], np.vstack([vectors, [1.0, 0.0]])

    def subset(task, name, firsts, gold):
        return Subset(task, name, tuple(firsts), (ref,) * len(firsts), np.array(gold, dtype=float))

    benchmark = Benchmark(
        (subset("STS12", "x", ["t0", "t1"], [5, 1]),),
        dev=subset("STSb", "dev", ["d0", "d1", "d2"], [5, 3, 1]),
        sick_dev=subset("SICK-R", "trial", ["s0", "s1", "s2"], [1, 3, 5]),
    )
    result = score_vectors(benchmark, sentences, vectors)
    assert result["stsb_dev"] == pytest.approx(100.0) and result["sick_dev"] == pytest.approx(-100.0)
    assert set(result["all"]) == {"STS12", "avg"} and result["all"]["avg"] == pytest.approx(100.0)


def test_identical_rows_are_exact_ties_at_cosine_one():
    from sentcl.evaluation.sts import cosine

    x = np.random.default_rng(0).normal(size=(200, 384)).astype(np.float32)
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    # Without the snap, float rounding leaves some cos(x, x) a few ulp away from 1: ties broken by noise.
    assert ((unit * unit).sum(1) != 1.0).any()
    assert (cosine(x, x) == 1.0).all()
    # Two identical pairs and a different one: the identical pairs tie exactly, so Spearman averages their ranks.
    sims = cosine(np.vstack([x[:2], x[2:3]]), np.vstack([x[:2], x[3:4]]))
    assert sims[0] == sims[1] == 1.0 and sims[2] < 1.0


def test_load_benchmark_reads_seven_tasks_and_skips_unscored_pairs(mini_data):
    root, counts = mini_data
    benchmark = load_benchmark(root)
    assert [s.task for s in benchmark.subsets].count("STS12") == 5
    assert sorted({s.task for s in benchmark.subsets}) == sorted(TASKS)
    assert benchmark.skipped_pairs == counts["skipped"] == 24  # one per STS12-16 subset: 5+3+6+5+5
    assert benchmark.pair_count == counts["pairs"]
    assert benchmark.dev is not None and len(benchmark.dev) == 18
    # SICK-R trial beside it (SICK_trial.txt), never one of the seven tasks' subsets.
    assert benchmark.sick_dev is not None and len(benchmark.sick_dev) == 18
    assert (benchmark.sick_dev.task, benchmark.sick_dev.name) == ("SICK-R", "trial")
    assert benchmark.sick_dev not in benchmark.subsets
    assert set(benchmark.sick_dev.sentences1) <= set(benchmark.sentences)
    assert load_benchmark(root, with_dev=False).sick_dev is None
    # Dedup: every sentence once, and fewer than the pair sides because the tiny vocabulary repeats some.
    assert len(benchmark.sentences) == len(set(benchmark.sentences))


def test_markdown_table_has_a_row_per_checkpoint_and_the_average():
    row = {t: 10.0 * i for i, t in enumerate(TASKS)} | {"avg": 30.0}
    table = markdown_table({"base": {"all": row}, "nli": {"all": row | {"STS12": 1.234}}})
    lines = table.strip().split("\n")
    assert lines[0] == "| Checkpoint | STS12 | STS13 | STS14 | STS15 | STS16 | STSb | SICK-R | Avg. |"
    assert lines[2] == "| base | 0.00 | 10.00 | 20.00 | 30.00 | 40.00 | 50.00 | 60.00 | 30.00 |"
    assert lines[3].startswith("| nli | 1.23 | 10.00")


_NAIVE: dict[tuple[Path, str], dict] = {}


def _naive_scores(model: Path, benchmark: Benchmark, pooling: str) -> dict:
    """The plain reference: every pair side of every subset encoded, all in one padded batch."""
    if (model, pooling) in _NAIVE:
        return _NAIVE[model, pooling]
    encoder = Encoder.from_pretrained(str(model), pooling=pooling, max_length=model_max_length(model))

    def encode_whole_list(sentences):
        # No dedup and no global sort: the list in its own order, padded to its longest sentence in one batch.
        return encoder.encode(sentences, batch_size=len(sentences))

    class NoDedup(Benchmark):
        @property
        def sentences(self):  # duplicates kept, so a repeated sentence is encoded again in another batch
            parts = [*self.subsets, self.dev, self.sick_dev]
            return [s for part in parts for side in (part.sentences1, part.sentences2) for s in side]

    _NAIVE[model, pooling] = evaluate(
        NoDedup(benchmark.subsets, benchmark.dev, benchmark.skipped_pairs, benchmark.sick_dev),
        encode_whole_list,
    )
    return _NAIVE[model, pooling]


@pytest.mark.parametrize("backend", ["torch", "onnx"])
@pytest.mark.parametrize("pooling", ["last-avg", "first-last-avg", "cls"])
def test_dedup_length_batching_and_backend_change_no_number(tiny_model, mini_data, backend, pooling):
    benchmark = load_benchmark(mini_data[0])
    expected = _naive_scores(tiny_model, benchmark, pooling)
    # A 64-token budget forces many batches of mixed widths, so padding really varies between rows.
    fast = FastEncoder(tiny_model, pooling=pooling, backend=backend, max_tokens=64)
    assert fast.backend == backend
    got = evaluate(benchmark, fast)
    for protocol in ("all", "mean"):
        assert got[protocol] == pytest.approx(expected[protocol], abs=1e-3)
    assert got["subsets"] == pytest.approx(expected["subsets"], abs=1e-3)
    assert got["stsb_dev"] == pytest.approx(expected["stsb_dev"], abs=1e-3)
    assert got["sick_dev"] == pytest.approx(expected["sick_dev"], abs=1e-3)


def test_worker_processes_give_the_vectors_of_one_process_in_input_order(tiny_model):
    words = ["a", "man", "is", "playing", "guitar", "the", "dog", "runs", "in", "snow", "red", "car"]
    rng = np.random.default_rng(0)
    # Enough sentences for the pool (1000+), of many lengths so that batches finish out of order.
    sentences = [" ".join(rng.choice(words, size=int(rng.integers(1, 30)))) for _ in range(1500)]
    one = FastEncoder(tiny_model, backend="onnx", workers=1, max_tokens=64)
    two = FastEncoder(tiny_model, backend="onnx", workers=2, threads=2, max_tokens=64)
    assert one.backend == two.backend == "onnx"
    np.testing.assert_allclose(two(sentences), one(sentences), atol=1e-5)
    assert (one.processes_used, two.processes_used) == (1, 2)
    torch_vectors = FastEncoder(tiny_model, backend="torch", max_tokens=64)(sentences)
    np.testing.assert_allclose(two(sentences), torch_vectors, atol=1e-4)


def test_token_budget_batches_are_length_sorted_and_within_budget(tiny_model):
    fast = FastEncoder(tiny_model, backend="torch", max_tokens=40, max_batch=4)
    sentences = ["a man", "a " * 20, "dog", "a woman is eating food", "cat cat", "red"] * 3
    widths, seen = [], []
    for rows, ids, mask in fast.batches(sentences):
        assert ids.size <= 40 or len(rows) == 1  # a lone row may exceed the budget; it cannot be split
        assert len(rows) <= 4
        assert (mask.sum(1) <= ids.shape[1]).all() and mask[:, -1].any()  # the longest row sets the width
        widths.append(ids.shape[1])
        seen += list(rows)
    assert widths == sorted(widths)
    assert sorted(seen) == list(range(len(sentences)))


def test_max_length_is_the_one_sentence_transformers_uses(tiny_model, tmp_path):
    from sentence_transformers import SentenceTransformer

    # The peer truncates where SentenceTransformer does; so must we, or long sentences score differently.
    assert model_max_length(tiny_model) == SentenceTransformer(str(tiny_model)).max_seq_length
    (tmp_path / "sentence_bert_config.json").write_text('{"max_seq_length": 7}')
    assert model_max_length(tmp_path) == 7


def test_standalone_command_on_a_tiny_model(tiny_model, mini_data, tmp_path, capsys):
    from stages.evaluate import main

    root, counts = mini_data
    output = tmp_path / "out" / "sts.json"
    assert (
        main(["--model", str(tiny_model), "--data", str(root), "--output", str(output), "--no-progress"]) == 0
    )
    result = json.loads(output.read_text())
    assert list(result["all"]) == [*TASKS, "avg"] and list(result["mean"]) == [*TASKS, "avg"]
    assert result["all"]["avg"] == pytest.approx(np.mean([result["all"][t] for t in TASKS]))
    # the command's numbers are the library's on the same folder: every pair encoded naively, in one batch
    naive = _naive_scores(tiny_model, load_benchmark(root), "last-avg")
    assert result["all"] == pytest.approx(naive["all"], abs=1e-3)
    assert result["stsb_dev"] == pytest.approx(naive["stsb_dev"], abs=1e-3)
    assert len(result["subsets"]) == 24 + 2  # every STS12-16 subset, STS-B test, SICK-R test
    # STS-B and SICK-R have one subset: both protocols must agree there.
    assert result["all"]["STSb"] == result["mean"]["STSb"] == result["subsets"]["STSb/test"]
    assert result["skipped_pairs"] == counts["skipped"]
    assert result["pooling"] == "last-avg" and result["model"] == str(tiny_model)
    assert isinstance(result["stsb_dev"], float) and result["seconds"] > 0

    # NAME=DIR (the retrain flow's form) gives a mapping of the same JSON, here in another pooling.
    mapping = tmp_path / "many.json"
    argv = [
        "--model",
        f"tiny={tiny_model}",
        "--data",
        str(root),
        "--output",
        str(mapping),
        "--pooling",
        "cls",
    ]
    assert main([*argv, "--no-progress"]) == 0
    many = json.loads(mapping.read_text())
    assert list(many) == ["tiny"] and many["tiny"]["pooling"] == "cls"
    assert many["tiny"]["all"]["STS12"] != result["all"]["STS12"]

    # --no-dev (what bench-eval times): the seven tasks alone, the same numbers, stsb_dev null.
    no_dev = tmp_path / "no-dev.json"
    argv = ["--model", str(tiny_model), "--data", str(root), "--output", str(no_dev), "--no-dev"]
    assert main([*argv, "--no-progress"]) == 0
    seven = json.loads(no_dev.read_text())
    assert seven["stsb_dev"] is None and seven["sick_dev"] is None
    assert seven["all"] == result["all"] and seven["subsets"] == result["subsets"]


def test_standalone_command_refuses_a_folder_not_in_senteval_layout(tiny_model, tmp_path):
    from stages.evaluate import main

    with pytest.raises(SystemExit, match="SentEval layout"):
        main(["--model", str(tiny_model), "--data", str(tmp_path)])


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED / "STS").is_dir(), reason="needs the SentEval mirror beside the checkout")
def test_bundled_minilm_reproduces_its_published_mteb_scores():
    from sentcl.evaluation.models import evaluate_model

    result = evaluate_model("all-MiniLM-L6-v2", load_benchmark(SHARED), progress=False)
    published = {
        "STS12": 72.37,
        "STS13": 80.60,
        "STS14": 75.59,
        "STS15": 85.39,
        "STS16": 78.99,
        "STSb": 82.03,
    }
    for task, score in published.items():
        assert result["all"][task] == pytest.approx(score, abs=0.05), task


def test_weights_digest_ignores_the_tokenizers_saved_call_state_but_not_its_vocabulary(tiny_model, tmp_path):
    """The bundled model's tokenizer.json keeps truncation 128 / fixed padding, a trained folder 64 / longest;
    no encoder here reads that state, so a stage that returns its init must still count as the same weights."""
    import shutil

    from sentcl.evaluation.models import weights_digest

    same, other = tmp_path / "same", tmp_path / "other"
    shutil.copytree(tiny_model, same)
    shutil.copytree(tiny_model, other)
    spec = json.loads((same / "tokenizer.json").read_text())
    spec["truncation"] = {"direction": "Right", "max_length": 7, "strategy": "LongestFirst", "stride": 0}
    spec["padding"] = None
    (same / "tokenizer.json").write_text(json.dumps(spec, indent=3))
    assert weights_digest(same) == weights_digest(tiny_model)
    spec = json.loads((other / "tokenizer.json").read_text())
    spec["model"]["vocab"]["[unused-extra]"] = len(spec["model"]["vocab"])
    (other / "tokenizer.json").write_text(json.dumps(spec))
    assert weights_digest(other) != weights_digest(tiny_model)


def split_inputs(stage, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001 (the stages.evaluate module)
    """What the evaluate stage splits by what each checkpoint saw (tests/unit/evaluation/test_seen_split.py checks the split):
    the validate stage's pairs and every training stage's seen text, here empty (nothing was trained on)."""
    from sentcl.training.recipes import training_stages

    processed, seen = tmp_path / "processed", tmp_path / "seen"
    write_tiny_processed(processed)
    seen.mkdir()
    for name in training_stages():
        (seen / f"{name}.txt").write_text("")
    monkeypatch.setattr(stage, "PROCESSED", processed)
    monkeypatch.setattr(stage, "SEEN", seen)


def test_pipeline_stage_writes_one_row_per_checkpoint_and_scores_equal_weights_once(
    tiny_model, mini_data, tmp_path, monkeypatch
):
    import shutil

    import stages.evaluate as stage

    models, metrics = tmp_path / "models", tmp_path / "metrics"
    for name in CHECKPOINTS:
        shutil.copytree(tiny_model, models / name)
    # A different model for one checkpoint: its row must differ from the copies'.
    other = make_tiny_encoder(tmp_path / "other", seed=1)
    shutil.rmtree(models / "joint")
    shutil.copytree(other, models / "joint")
    monkeypatch.setattr(stage, "MODELS", models)
    monkeypatch.setattr(stage, "METRICS", metrics)
    split_inputs(stage, tmp_path, monkeypatch)
    monkeypatch.setenv("SENTCL_MLFLOW", "0")
    params = {"evaluate": {"backend": "torch"}, "model": {"max_length": 32}}
    results = stage.run_pipeline(params, mini_data[0], None, None)

    written = json.loads((metrics / "sts.json").read_text())
    assert list(written) == list(CHECKPOINTS) == list(results)
    assert written["nli"]["same_weights_as"] == "base" and written["nli"]["all"] == written["base"]["all"]
    assert "same_weights_as" not in written["joint"] and written["joint"]["all"] != written["base"]["all"]
    assert written["transfer-joint"]["model"] == "models/transfer-joint"
    table = (metrics / "sts.md").read_text()
    # Once per protocol table, once in the split summary, once per split (seen, unseen, mixed) by task.
    assert table.count("| transfer-nli |") == 2 + 1 + 3
    # The DVC metrics: one small file per checkpoint, two keys, two decimals, no wall time or path (issue 14).
    for name in CHECKPOINTS:
        summary = json.loads((metrics / "eval" / f"{name}.json").read_text())
        assert summary == {
            "avg": round(written[name]["all"]["avg"], 2),
            "stsb_dev": round(written[name]["stsb_dev"], 2),
            "sick_dev": round(written[name]["sick_dev"], 2),
        }
