"""Retraining for a domain (issue 11): selection on the domain dev set with STS-B dev as a guard, TSDAE as an
objective of the trainer, the text reader on long lines and bad files, the transfer stage's ``--domain-dev``."""

from __future__ import annotations

import csv
import json
import logging

import numpy as np
import pytest
import torch
import yaml

from sentcl.model.encoder import Encoder
from sentcl.model.folder import count_truncated
from sentcl.training.selection import selectable
from sentcl.training.trainer import Trainer
from stages.training import read_texts
from tests.tiny import make_tiny_encoder, tiny_sentences, train_config, write_tiny_processed

TEXTS = tiny_sentences(64, seed=1)
DEV = [(TEXTS[i], TEXTS[i + 1], float(i % 5)) for i in range(0, 40, 2)]
DOMAIN_DEV = [(TEXTS[i], TEXTS[i + 3], float(i % 4)) for i in range(20, 60, 2)]
PROBE = ["a man is playing the guitar"]


# --- the selection rule -----------------------------------------------------------------------------------


def test_without_a_domain_set_selection_is_stsb_dev_above_the_best_by_min_delta():
    init = best = {"stsb_dev": 80.0}
    assert selectable({"stsb_dev": 80.2}, best, init, min_delta=0.1)
    assert not selectable({"stsb_dev": 80.1}, best, init, min_delta=0.1)  # not *more* than min_delta
    assert not selectable({"stsb_dev": 79.0}, best, init, min_delta=0.0)


def test_with_a_domain_set_the_domain_selects_and_stsb_dev_only_guards():
    init = {"stsb_dev": 80.0, "domain_dev": 60.0}
    best = {"stsb_dev": 81.0, "domain_dev": 62.0}
    # STS-B dev falls, within the guard: the domain gain wins.
    assert selectable({"stsb_dev": 79.5, "domain_dev": 63.0}, best, init, 0.0, max_task_drop=1.0)
    # Exactly max_task_drop below the init is still allowed; beyond it, no domain gain is enough.
    assert selectable({"stsb_dev": 79.0, "domain_dev": 63.0}, best, init, 0.0, max_task_drop=1.0)
    assert not selectable({"stsb_dev": 78.9, "domain_dev": 99.0}, best, init, 0.0, max_task_drop=1.0)
    # The guard is measured from the init, not from the best so far.
    assert selectable({"stsb_dev": 79.2, "domain_dev": 62.5}, best, init, 0.0, max_task_drop=1.0)
    # A better STS-B dev does not select a step that does not improve the domain.
    assert not selectable({"stsb_dev": 90.0, "domain_dev": 62.0}, best, init, 0.0, max_task_drop=1.0)
    assert not selectable({"stsb_dev": 80.0, "domain_dev": 62.4}, best, init, 0.5, max_task_drop=1.0)
    with pytest.raises(ValueError, match="max_task_drop"):
        selectable({"stsb_dev": 80.0, "domain_dev": 70.0}, best, init, 0.0)


class Scripted:
    """An evaluator that returns the next score of a script and remembers the model it was shown."""

    def __init__(self, scores: list[float]) -> None:
        self.scores, self.seen = iter(scores), []

    def __call__(self, encode) -> float:
        self.seen.append(encode(PROBE))
        return next(self.scores)


# Evaluations at steps 0..6. Max task drop 1.0 from the init's STS-B dev 50: anything under 49 is guarded.
STSB = [50.0, 52.0, 49.0, 48.0, 51.0, 47.0, 50.0]
DOMAIN = [30.0, 31.0, 35.0, 33.0, 34.0, 40.0, 32.0]


def scripted_fit(model, domain: bool):
    encoder = Encoder.from_pretrained(str(model))
    config = train_config(steps=6, eval_steps=1, batch_size=8, lr=1e-3, patience=10, min_delta=0.0)
    extra = {"domain_dev": DOMAIN_DEV, "max_task_drop": 1.0} if domain else {}
    trainer = Trainer(encoder, config, TEXTS, DEV, progress=False, **extra)
    trainer.evaluator = stsb = Scripted(STSB)
    if domain:
        trainer.domain_evaluator = Scripted(DOMAIN)
    return encoder, trainer.fit(), stsb


def test_trainer_selects_on_the_domain_dev_set_and_the_guard_rejects_a_large_stsb_drop(tiny_model):
    encoder, result, stsb = scripted_fit(tiny_model, domain=True)
    # Step 5 has the best domain score (40) but STS-B dev 47 is 3 below the init: the guard rejects it.
    # Step 2 (domain 35, STS-B dev 49: 1.0 down) is selected; STS-B dev alone would take step 1 (52).
    assert result.best_step == 2
    assert (result.domain_init, result.domain_best, result.init_score, result.best_score) == (30, 35, 50, 49)
    np.testing.assert_array_equal(encoder.encode(PROBE), stsb.seen[2])  # the encoder holds step 2's weights
    assert not np.allclose(stsb.seen[2], stsb.seen[1]) and not np.allclose(stsb.seen[2], stsb.seen[6])
    metrics = result.metrics()
    assert metrics["selected_on"] == "domain_dev" and metrics["max_task_drop"] == 1.0
    assert (metrics["domain_dev_step0"], metrics["domain_dev_best"], metrics["stsb_dev_best"]) == (30, 35, 49)
    assert [r["domain_dev"] for r in result.rows] == DOMAIN

    _, alone, _ = scripted_fit(tiny_model, domain=False)
    assert alone.best_step == 1 and alone.best_score == 52 and "domain_dev_best" not in alone.metrics()


def test_a_domain_set_without_a_guard_is_refused(tiny_model):
    encoder = Encoder.from_pretrained(str(tiny_model))
    with pytest.raises(ValueError, match="max_task_drop"):
        Trainer(
            encoder, train_config(steps=2, batch_size=8), TEXTS, DEV, progress=False, domain_dev=DOMAIN_DEV
        )


# --- TSDAE ------------------------------------------------------------------------------------------------


def tsdae_trainer(model, **overrides):
    values = {"objective": "tsdae", "steps": 20, "batch_size": 8, "lr": 1e-3, "warmup_ratio": 0, **overrides}
    return Trainer(Encoder.from_pretrained(str(model)), train_config(**values), TEXTS, DEV, progress=False)


def fixed_batch_loss(trainer) -> float:
    """The TSDAE loss of the first 16 sentences with the same noise and no dropout."""
    trainer.generator.manual_seed(123)
    trainer.encoder.eval()
    trainer.objective.eval()
    with torch.no_grad():
        return float(trainer.loss(trainer.representations(TEXTS[:16])))


def test_tsdae_recipe_comes_from_params_yaml():
    params = yaml.safe_load(open("params.yaml"))
    config = train_config(objective="tsdae")
    assert config.objective == "tsdae" and config.deletion_ratio == params["train"]["deletion_ratio"] == 0.6
    assert (config.lr, config.batch_size) == (
        params["transfer"]["tsdae"]["lr"],
        params["transfer"]["tsdae"]["batch_size"],
    )
    assert train_config().objective == params["transfer"]["objective"] == "contrastive"


def test_tsdae_damage_deletes_whitespace_words_and_keeps_one(tiny_model):
    objective = tsdae_trainer(tiny_model).objective
    generator = torch.Generator().manual_seed(0)
    words = [f"w{i}" for i in range(2000)]
    kept = objective.damage(" ".join(words), generator).split()
    assert 0.35 < len(kept) / len(words) < 0.45  # deletion ratio 0.6
    assert kept == [w for w in words if w in set(kept)]  # order kept, nothing invented
    for _ in range(50):
        assert len(objective.damage("one two", generator).split()) >= 1
    assert objective.damage("", generator) == ""


def test_tsdae_decoder_is_tied_to_the_encoder_and_keeps_its_weights_in_memory(tiny_model):
    encoder = Encoder.from_pretrained(str(tiny_model))
    with torch.no_grad():
        encoder.model.embeddings.word_embeddings.weight.add_(0.5)  # differs from the folder now
    moved = encoder.model.embeddings.word_embeddings.weight.detach().clone()
    from sentcl.training.objectives.factory import build_objective

    objective = build_objective(train_config(objective="tsdae"), encoder.dim, encoder)
    decoder = objective.dae.decoder
    assert decoder.bert.embeddings.word_embeddings.weight is encoder.model.embeddings.word_embeddings.weight
    assert (
        decoder.bert.encoder.layer[0].attention.self.query.weight
        is encoder.model.encoder.layer[0].attention.self.query.weight
    )
    torch.testing.assert_close(encoder.model.embeddings.word_embeddings.weight.detach(), moved)


def test_a_few_tsdae_steps_reduce_its_loss_and_the_encoder_folder_loads(tiny_model, tmp_path):
    trainer = tsdae_trainer(tiny_model, lr=3e-3)
    before = fixed_batch_loss(trainer)  # ~ln(vocabulary size): the fresh decoder knows nothing yet
    for step in range(20):
        trainer.train_step(trainer._rank_items(trainer.order.indices(step)), step + 1)
    after = fixed_batch_loss(trainer)
    assert after < 0.9 * before, (before, after)  # 4.97 -> 4.05 when written

    trainer.encoder.save(tmp_path / "out")
    from safetensors.torch import load_file
    from sentence_transformers import SentenceTransformer
    from transformers import AutoConfig

    keys = load_file(tmp_path / "out" / "model.safetensors")
    assert not any(
        "crossattention" in k or k.startswith("cls.") for k in keys
    )  # the encoder, not the decoder
    assert AutoConfig.from_pretrained(tmp_path / "out").is_decoder is False
    ours = trainer.encoder.encode(TEXTS[:5], pooling="last-avg")
    theirs = SentenceTransformer(str(tmp_path / "out"), device="cpu").encode(TEXTS[:5])
    np.testing.assert_allclose(theirs, ours, atol=1e-5)
    assert not np.allclose(ours, Encoder.from_pretrained(str(tiny_model)).encode(TEXTS[:5]))


def test_tsdae_with_grad_accumulation_equals_one_large_batch(still_model):
    """Gradient caching with the decoder's loss over the whole batch: the same update (no noise, no dropout)."""

    def weights_after(**config):
        # fp32 pinned: exact arithmetic, whatever `train.bf16: auto` picks on this CPU
        trainer = tsdae_trainer(still_model, steps=3, deletion_ratio=0.0, bf16=False, **config)
        for step in range(3):
            trainer.train_step(trainer._rank_items(trainer.order.indices(step)), step + 1)
        return {k: v.clone() for k, v in trainer.encoder.model.state_dict().items()}

    whole, accumulated = weights_after(), weights_after(grad_accum=4)
    for key in whole:
        torch.testing.assert_close(whole[key], accumulated[key], atol=1e-5, rtol=0, msg=key)


def test_tsdae_trains_through_fit_with_selection(tiny_model):
    result = tsdae_trainer(tiny_model, steps=2, eval_steps=1).fit()
    assert result.steps == 2 and all(np.isfinite(r["loss"]) for r in result.rows[1:])


def test_tsdae_refuses_a_momentum_queue(capsys):
    with pytest.raises(SystemExit):
        train_config(objective="tsdae", queue_size=16)
    assert "queue_size: 0 with tsdae" in capsys.readouterr().err


# --- the text reader ----------------------------------------------------------------------------------------


def test_bad_files_are_skipped_with_one_warning_each_and_never_block_the_others(tmp_path, caplog):
    (tmp_path / "good.txt").write_text("a man is eating\n\n  a dog runs  \na man is eating\n")
    (tmp_path / "more").mkdir()
    (tmp_path / "more" / "notes").write_text("two people walking\n")  # any name: every file is read
    (tmp_path / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    (tmp_path / "utf16.txt").write_text("a cat sleeps\n", encoding="utf-16")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    (tmp_path / "upload.txt.part").write_text("half a sen")
    (tmp_path / ".hidden.txt").write_text("not me\n")
    with caplog.at_level(logging.WARNING, logger="stages.training"):
        texts = read_texts(tmp_path)
    assert texts == ["a man is eating", "a dog runs", "two people walking"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 4
    for name in ("photo.png", "utf16.txt", "latin1.txt", "upload.txt.part"):
        assert sum(name in w for w in warnings) == 1, (name, warnings)
    assert all("\n" not in w and "skipped" in w for w in warnings)


@pytest.mark.parametrize("content", [None, b"", b"\x00\x01\x02", b"  \n\n"])
def test_a_folder_with_no_usable_text_stops_with_one_line(tmp_path, capsys, content):
    folder = tmp_path / "inbox"
    folder.mkdir()
    if content is not None:
        (folder / "f.txt").write_bytes(content)
    with pytest.raises(SystemExit) as exit_info:
        read_texts(folder)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"{folder}: no usable text")


def test_long_lines_are_counted_not_refused(tiny_model, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    short = "a man is eating"  # 4 words, one token each: 6 with [CLS] and [SEP]
    long = " ".join(["dog"] * 30)  # 32 tokens
    (tmp_path / "t.txt").write_text(f"{short}\n{long}\n")
    texts = read_texts(tmp_path / "t.txt")
    assert texts == [short, long]
    assert count_truncated(tokenizer, texts, 32) == 0
    assert count_truncated(tokenizer, texts, 31) == 1
    assert count_truncated(tokenizer, texts, 5) == 2


# --- the inbox ------------------------------------------------------------------------------------------------


def test_new_inbox_files_are_those_not_archived_and_not_still_uploading(tmp_path):
    from sentcl.data.domain import in_inbox, new_inbox_files

    box = tmp_path / "inbox"
    (box / "processed" / "2026-11-29").mkdir(parents=True)
    (box / "processed" / "2026-11-29" / "old.txt").write_text("old\n")
    (box / "team-a").mkdir()
    for name in ("a.txt", "team-a/b.txt", "c.txt.part", "d.tmp", ".hidden.txt"):
        (box / name).write_text("x\n")
    assert [p.relative_to(box.resolve()).as_posix() for p in new_inbox_files(box, box)] == [
        "a.txt",
        "team-a/b.txt",
    ]
    assert new_inbox_files(box / "a.txt", box) == [(box / "a.txt").resolve()]  # an event names one file
    assert new_inbox_files(box / "gone.txt", box) == []  # archived by an earlier run: nothing new
    assert in_inbox(box, box) and in_inbox(box / "team-a", box)
    assert not in_inbox(box / "processed" / "2026-11-29", box) and not in_inbox(tmp_path, box)


def test_archive_moves_files_under_processed_date_and_never_overwrites(tmp_path):
    from sentcl.data.domain import archive

    box = tmp_path / "inbox"
    (box / "team-a").mkdir(parents=True)
    (box / "a.txt").write_text("first\n")
    (box / "team-a" / "b.txt").write_text("b\n")
    archive([box / "a.txt", box / "team-a" / "b.txt"], box, "2026-11-30")
    (box / "a.txt").write_text("second\n")  # the same name again, the same day
    archive([box / "a.txt"], box, "2026-11-30")
    day = box / "processed" / "2026-11-30"
    assert (day / "a.txt").read_text() == "first\n" and (day / "a.1.txt").read_text() == "second\n"
    assert (day / "team-a" / "b.txt").read_text() == "b\n"
    assert sorted(p.name for p in box.iterdir()) == ["processed", "team-a"] and not any(
        (box / "team-a").iterdir()
    )


def test_reading_only_the_new_files_fingerprints_only_them(tmp_path):
    from sentcl.data.domain import read_domain_text

    (tmp_path / "a.txt").write_text("one sentence\ntwo sentences\n")
    (tmp_path / "b.txt").write_text("three sentences\nfour sentences\n")
    whole = read_domain_text(tmp_path)
    only_b = read_domain_text(tmp_path, files=[tmp_path / "b.txt"])
    assert only_b.sentences == ["three sentences", "four sentences"] and only_b.files == [tmp_path / "b.txt"]
    assert (
        only_b.sha256 != whole.sha256 == read_domain_text(tmp_path, files=sorted(tmp_path.iterdir())).sha256
    )


# --- the transfer stage -----------------------------------------------------------------------------------


@pytest.fixture
def stage_args(tmp_path, monkeypatch):
    monkeypatch.setenv("SENTCL_MLFLOW", "0")
    model = make_tiny_encoder(tmp_path / "hub")
    processed = write_tiny_processed(tmp_path / "processed")
    params = yaml.safe_load(open("params.yaml"))
    params["seed"], params["model"] = 1, {"name": str(model), "max_length": 12}
    params["train"].update(eval_steps=1, patience=10, device="cpu")
    params["transfer"].update(steps=3, batch_size=8, lr=1e-3, eval_steps=1)
    params["transfer"]["tsdae"].update(lr=1e-3)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    args = ["--params", str(tmp_path / "params.yaml"), "--processed", str(processed), "--init", str(model)]
    args += ["--metrics-dir", str(tmp_path / "metrics"), "--checkpoints-dir", str(tmp_path / "ckpt")]
    args += ["--stage", "domain", "--output", str(tmp_path / "out")]
    return args, tmp_path, params


def write_pairs(path, pairs):
    path.write_text("".join(f"{a}\t{b}\t{s}\n" for a, b, s in pairs))
    return path


@pytest.mark.parametrize("objective", ["contrastive", "tsdae"])
def test_transfer_stage_selects_on_domain_dev_and_records_it(stage_args, objective):
    from stages import transfer

    args, tmp_path, params = stage_args
    text = tmp_path / "domain"
    text.mkdir()
    long = " ".join(["guitar"] * 20)  # 22 tokens > max_length 12
    (text / "a.txt").write_text("\n".join(tiny_sentences(30, seed=5) + [long]))
    (text / "b.bin").write_bytes(b"\x00\xff")
    dev = write_pairs(tmp_path / "dev.tsv", DOMAIN_DEV)
    transfer.main([*args, "--texts", str(text), "--domain-dev", str(dev), "--objective", objective])
    record = json.loads((tmp_path / "metrics" / "train" / "domain.json").read_text())
    assert record["selected_on"] == "domain_dev"
    assert record["max_task_drop"] == params["registry"]["max_dev_drop"]
    assert {"domain_dev_step0", "domain_dev_best"} <= set(record)
    assert record["examples"] == 31 and record["texts_truncated"] >= 1
    rows = list(csv.DictReader(open(tmp_path / "metrics" / "curves" / "domain.csv")))
    assert [r["step"] for r in rows if r["domain_dev"]] == ["0", "1", "2", "3"]
    # the curve keeps every digit, the metrics record two decimals
    assert float(rows[0]["domain_dev"]) == pytest.approx(record["domain_dev_step0"], abs=0.005 + 1e-9)
    assert Encoder.from_pretrained(str(tmp_path / "out")).encode(["a man"]).shape == (1, 32)


@pytest.mark.parametrize(
    "content,message",
    [
        (None, "no such file"),
        ("a\tb\t1\nc\td\n", "dev.tsv:2: expected sentence1<TAB>sentence2<TAB>score"),
        ("s1\ts2\tscore\na\tb\t1\nc\td\tlots\n", "dev.tsv:3: score 'lots' is not a number"),
    ],
)
def test_a_missing_or_malformed_domain_dev_file_stops_with_one_line(stage_args, capsys, content, message):
    from stages import transfer

    args, tmp_path, _ = stage_args
    dev = tmp_path / "dev.tsv"
    if content is not None:
        dev.write_text(content)
    with pytest.raises(SystemExit) as exit_info:
        transfer.main([*args, "--texts", "heldout", "--domain-dev", str(dev)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err and str(dev) in err
    assert not (tmp_path / "out").exists()


# --- make bench-domain --------------------------------------------------------------------------------------


def selected_step(curve, min_delta: float, max_drop: float | None = None) -> int:
    """The step a run selected, from its curves file: transcribed from the rule (docs/methods.md), not read from
    its records. Without ``max_drop``: STS-B dev above the best so far by more than ``min_delta``; with it (a
    domain set): the domain score so, STS-B dev no more than ``max_drop`` below the init's."""
    rows = [r for r in csv.DictReader(open(curve)) if r["stsb_dev"]]
    init = best = rows[0]
    step = 0
    for row in rows[1:]:
        if max_drop is None:
            better = float(row["stsb_dev"]) > float(best["stsb_dev"]) + min_delta
        else:
            guarded = float(row["stsb_dev"]) >= float(init["stsb_dev"]) - max_drop
            better = guarded and float(row["domain_dev"]) > float(best["domain_dev"]) + min_delta
        if better:
            best, step = row, int(row["step"])
    return step


def test_bench_domain_scores_before_and_after_each_method_on_a_tiny_model(stage_args, capsys):
    import pandas as pd

    from benchmarks.bench_domain import main
    from sentcl.data.roles import normalise
    from sentcl.evaluation.sts import STSEvaluator

    args, tmp_path, params = stage_args
    # No retrain can beat the starting model by 1,000 points: the gate row must say "would reject".
    params["registry"].update(min_delta=1000.0, min_domain_delta=1000.0)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    model = args[args.index("--init") + 1]
    text = tmp_path / "text.txt"
    text.write_text("\n".join(tiny_sentences(40, seed=7)))
    test_pairs = [(TEXTS[i], TEXTS[i + 5], float(i % 3)) for i in range(0, 30)]
    dev, test = write_pairs(tmp_path / "dev.tsv", DOMAIN_DEV), write_pairs(tmp_path / "test.tsv", test_pairs)
    common = [
        "--params",
        args[args.index("--params") + 1],
        "--processed",
        args[args.index("--processed") + 1],
    ]
    main(
        [*common, "--text", str(text), "--dev", str(dev), "--test", str(test), "--from", model]
        + [
            "--method",
            "tsdae",
            "tsdae+contrastive",
            "--steps",
            "2",
            "--tsdae-steps",
            "3",
            "--backend",
            "torch",
        ]
        + ["--work", str(tmp_path / "work"), "--json", str(tmp_path / "bench.json")]
    )
    out = capsys.readouterr().out
    assert "| test, seen pairs |" in out and "| test, unseen pairs |" in out and "| STS-B dev |" in out
    assert "train wall s" in out and "| same step as labelled |" in out
    result = json.loads((tmp_path / "bench.json").read_text())
    assert list(result["methods"]) == [
        "tsdae labelled",
        "tsdae label-free",
        "tsdae+contrastive labelled",
        "tsdae+contrastive label-free",
    ]
    labelled, free = (
        result["methods"]["tsdae+contrastive labelled"],
        result["methods"]["tsdae+contrastive label-free"],
    )
    assert [r["objective"] for r in labelled["runs"]] == ["tsdae", "contrastive"]
    assert [r["steps"] for r in labelled["runs"]] == [3, 2]
    assert (
        all(r["selected_on"] == "domain_dev" for r in labelled["runs"])
        and labelled["selected_on"] == "domain_dev"
    )
    # Without labels a method that does not distil selects on STS-B dev, as the retrain flow does.
    assert all(r["selected_on"] == "stsb_dev" for r in free["runs"]) and free["selected_on"] == "stsb_dev"
    # The steps each mode selected, from the curves each run wrote, by the selection rule transcribed above:
    # labelled on the domain dev pairs (STS-B dev a guard), label-free on STS-B dev.
    curves = tmp_path / "work" / "{0}" / "metrics" / "curves" / "{0}-{1}.csv"
    min_delta, max_drop = params["train"]["min_delta"], params["registry"]["max_dev_drop"]
    runs = ("tsdae", "tsdae-contrastive")  # the runs of tsdae+contrastive, by their stage names
    steps = {
        "labelled": [selected_step(str(curves).format("labelled", r), min_delta, max_drop) for r in runs],
        "label-free": [selected_step(str(curves).format("label-free", r), min_delta) for r in runs],
    }
    assert [r["best_step"] for r in labelled["runs"]] == steps["labelled"]
    assert [r["best_step"] for r in free["runs"]] == steps["label-free"]
    assert free["same_choice"] == (steps["labelled"] == steps["label-free"])
    # Test pairs split by the text trained on and what selection or the gate read (the domain dev pairs, STS-B
    # dev and SICK-R trial of the tiny pairs table): 30 pairs of TEXTS sentences, which the tiny text does not
    # hold except where tiny_sentences drew the same one; counted by hand from the lists here.
    table = pd.read_parquet(args[args.index("--processed") + 1] + "/pairs.parquet")
    dev_splits = table[table.split == "dev"]
    read = {normalise(s) for s in [*dev_splits.sentence1, *dev_splits.sentence2]}
    read |= {normalise(s) for a, b, _ in DOMAIN_DEV for s in (a, b)}
    trained = {normalise(s) for s in text.read_text().splitlines()}
    seen = sum(normalise(a) in trained and normalise(b) in trained for a, b, _ in test_pairs)
    untrained = [
        (a, b) for a, b, _ in test_pairs if normalise(a) not in trained and normalise(b) not in trained
    ]
    unseen = sum(normalise(a) not in read and normalise(b) not in read for a, b in untrained)
    split = labelled["after"]["test"]
    counts = tuple(split[s]["pairs"] for s in ("seen", "unseen", "mixed", "read"))
    assert counts == (seen, unseen, 30 - seen - len(untrained), len(untrained) - unseen)
    assert 0 < len(untrained) - unseen < len(untrained)  # the domain dev pairs share sentences with the test
    # "before" is the starting model scored on the test pairs, checked here with sentcl's own encoder.
    encoder = Encoder.from_pretrained(model)
    expected = STSEvaluator(test_pairs)(lambda s: encoder.encode(s, pooling="last-avg"))
    assert labelled["before"]["test"]["all"] == pytest.approx(expected, abs=0.01)
    # Labelled: selection and the gate read the same domain dev pairs; label-free (no teacher): STS-B dev.
    assert set(labelled["after"]) == {"test", "stsb_dev", "selection", "gate"}
    assert set(free["after"]) == {"test", "stsb_dev"}
    judged = labelled["judged_on"]
    assert judged["selection"]["file"] == judged["gate"]["file"] == str(dev)
    assert (
        judged["gate"]["pairs"] == len(DOMAIN_DEV)
        and judged["shared_sentences"] == judged["gate"]["sentences"]
    )
    # tsdae+contrastive continued from the very TSDAE run of `tsdae` instead of training it again
    models = tmp_path / "work" / "labelled" / "models"
    assert labelled["runs"][1]["init"] == str(models / "labelled-tsdae")
    assert labelled["runs"][0] == result["methods"]["tsdae labelled"]["runs"][0]
    assert sorted(p.name for p in models.iterdir()) == ["labelled-tsdae", "labelled-tsdae-contrastive"]
    assert out.count("bench-domain: reusing the labelled-tsdae run") == 1
    # the gate's rule on STS-B dev and the gate set, after vs before; nothing registered anywhere
    assert labelled["gate"]["decision"] == free["gate"]["decision"] == "would reject"
    assert "| gate (STS-B dev" in out
    assert any(r.startswith("stsb_dev ") and "min_delta 1000.00" in r for r in labelled["gate"]["reasons"])


def test_bench_domain_from_champion_without_one_is_one_line_exit_2(stage_args, tmp_path, monkeypatch, capsys):
    from benchmarks.bench_domain import main

    args, _, _ = stage_args
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'empty.db'}")
    with pytest.raises(SystemExit) as exit_info:
        main(
            ["--params", args[args.index("--params") + 1], "--processed", args[args.index("--processed") + 1]]
            + ["--from", "champion", "--work", str(tmp_path / "work")]
        )
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # (MLflow logs creating the scratch store first)
    assert err.startswith("--from champion: 'sentcl-encoder' has no 'champion' version")


def test_bench_domain_reads_dev_and_test_with_the_transfer_stage_reader(stage_args, tmp_path, capsys):
    from benchmarks.bench_domain import main

    args, _, _ = stage_args
    (tmp_path / "text.txt").write_text("one sentence\nanother sentence\n")
    (tmp_path / "bad.tsv").write_text("a\tb\t1\nc\td\n")
    write_pairs(tmp_path / "dev.tsv", DOMAIN_DEV)
    common = [
        "--params",
        args[args.index("--params") + 1],
        "--processed",
        args[args.index("--processed") + 1],
    ]
    with pytest.raises(SystemExit) as exit_info:
        main(
            [*common, "--text", str(tmp_path / "text.txt"), "--dev", str(tmp_path / "dev.tsv")]
            + ["--test", str(tmp_path / "bad.tsv"), "--work", str(tmp_path / "work")]
        )
    assert exit_info.value.code == 2
    assert (
        capsys.readouterr().err.strip()
        == f"--test {tmp_path / 'bad.tsv'}:2: expected sentence1<TAB>sentence2<TAB>score"
    )


# --- make bench-domain with a teacher (distill) -------------------------------------------------------------


def _bench_with_teacher(stage_args, teacher, dev_pairs, methods, capsys):
    """bench-domain on tiny text with ``teacher`` as teacher.model (torch: no ONNX export of a tiny model)."""
    from benchmarks.bench_domain import main

    args, tmp_path, params = stage_args
    params["teacher"].update(model=str(teacher), backend="torch")
    params["retrain"]["heldout_share"] = 0.5  # of 40 sentences: two parts of ~10, each with pairs to rank by
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    text = tmp_path / "text.txt"
    text.write_text("\n".join(tiny_sentences(40, seed=7)))
    test_pairs = [(TEXTS[i], TEXTS[i + 5], float(i % 3)) for i in range(0, 30)]
    dev, test = write_pairs(tmp_path / "dev.tsv", dev_pairs), write_pairs(tmp_path / "test.tsv", test_pairs)
    main(
        ["--params", str(tmp_path / "params.yaml"), "--processed", args[args.index("--processed") + 1]]
        + [
            "--text",
            str(text),
            "--dev",
            str(dev),
            "--test",
            str(test),
            "--from",
            args[args.index("--init") + 1],
        ]
        + ["--method", *methods, "--steps", "2", "--backend", "torch"]
        + ["--work", str(tmp_path / "work"), "--json", str(tmp_path / "bench.json")]
    )
    return json.loads((tmp_path / "bench.json").read_text()), capsys.readouterr().out


def test_bench_domain_skips_distilling_from_a_teacher_no_better_than_the_student(stage_args, capsys):
    """The teacher is the starting model itself: both numbers printed and stored, the method untrained."""
    from sentcl.evaluation.sts import STSEvaluator

    args, tmp_path, _ = stage_args
    student = args[args.index("--init") + 1]
    result, out = _bench_with_teacher(stage_args, student, DOMAIN_DEV, ["distill"], capsys)
    teacher = result["teacher"]
    encoder = Encoder.from_pretrained(student)
    expected = STSEvaluator(DOMAIN_DEV)(lambda s: encoder.encode(s, pooling="last-avg"))
    assert teacher["student"] == pytest.approx(expected, abs=0.05)
    assert teacher["teacher"] == pytest.approx(expected, abs=0.2)  # (its fp16 vectors)
    assert result["methods"] == {} and list(result["skipped"]) == ["distill"]
    assert "nothing to distil" in result["skipped"]["distill"]
    assert f"teacher {teacher['teacher']:.2f}, starting model {teacher['student']:.2f}" in out
    assert "distill: skipped: teacher" in out and not (tmp_path / "work" / "labelled" / "models").exists()
    assert not (tmp_path / "work" / "label-free").exists()  # untrained in both modes


def test_bench_domain_distils_from_a_better_teacher(stage_args, capsys):
    """Dev gold = the teacher's own cosine: it leads by far, so distill trains, from the stage's vectors."""
    from sentcl.evaluation.sts import STSEvaluator, cosine
    from sentcl.model.fast_encode import FastEncoder
    from tests.unit.training.test_distill import make_tiny_teacher

    args, tmp_path, _ = stage_args
    teacher = make_tiny_teacher(tmp_path)
    encode = FastEncoder(teacher, backend="torch")
    gold = cosine(encode([a for a, _, _ in DOMAIN_DEV]), encode([b for _, b, _ in DOMAIN_DEV]))
    dev = [(a, b, round(float(g), 4)) for (a, b, _), g in zip(DOMAIN_DEV, gold, strict=True)]
    result, out = _bench_with_teacher(stage_args, teacher, dev, ["distill"], capsys)
    assert result["teacher"]["teacher"] > 99.0 and result["teacher"]["nothing_to_distil"] is None
    assert result["skipped"] == {}
    (run,) = result["methods"]["distill labelled"]["runs"]
    assert run["objective"] == "distill" and run["steps"] == 2 and run["selected_on"] == "domain_dev"
    # Without labels: the held-out share is set aside before the teacher stage in two parts, the rest trains;
    # the run selects on the teacher's agreement pairs within the selection part, the gate row judges on the
    # pairs within the gate part.
    work = tmp_path / "work" / "label-free"
    parts = {p: set((work / f"heldout-{p}.txt").read_text().splitlines()) for p in ("selection", "gate")}
    held = parts["selection"] | parts["gate"]
    trained = set((work / "texts.txt").read_text().splitlines())
    assert parts["selection"] and parts["gate"] and not parts["selection"] & parts["gate"]
    assert not held & trained and held | trained == set((tmp_path / "text.txt").read_text().splitlines())
    assert not held & set((work / "metrics" / "seen" / "label-free-distill.txt").read_text().splitlines())
    agreement = {
        p: [line.split("\t") for line in (work / "teacher" / f"agreement-{p}.tsv").read_text().splitlines()]
        for p in parts
    }
    for p, rows in agreement.items():
        assert rows and all(a in parts[p] and b in parts[p] for a, b, _ in rows)
    method = result["methods"]["distill label-free"]
    (free,) = method["runs"]
    assert free["selected_on"] == "teacher_agreement" == method["selected_on"]
    assert free["agreement_pairs"] == len(agreement["selection"])  # what selection read: its part only
    assert free["heldout_sentences"] == len(parts["selection"])
    assert result["label_free"]["heldout"] == len(held)
    assert (result["label_free"]["selection_part"], result["label_free"]["gate_part"]) == (
        len(parts["selection"]),
        len(parts["gate"]),
    )
    judged = method["judged_on"]
    assert judged["gate"]["file"] == str(work / "teacher" / "agreement-gate.tsv")
    assert judged["gate"]["pairs"] == len(agreement["gate"]) and judged["shared_sentences"] == 0
    # The gate row's domain score is the gate part's: the starting model's Spearman there, computed here.
    encoder = Encoder.from_pretrained(args[args.index("--init") + 1])
    gate_pairs = [(a, b, float(g)) for a, b, g in agreement["gate"]]
    expected = STSEvaluator(gate_pairs)(lambda s: encoder.encode(s, pooling="last-avg"))
    assert method["before"]["gate"] == pytest.approx(expected, abs=0.05)
    # No test pair holding a held-out sentence is unseen (and the split says how many it moved).
    assert "| test, unseen pairs |" in out and "| test, read pairs (by selection or the gate) |" in out


def test_bench_domain_distill_without_a_teacher_is_one_line_exit_2(stage_args, capsys):
    import yaml

    from benchmarks.bench_domain import main

    args, tmp_path, _ = stage_args
    params = yaml.safe_load(open(args[args.index("--params") + 1]))
    params["teacher"]["model"] = "none"
    no_teacher = tmp_path / "no-teacher-params.yaml"
    no_teacher.write_text(yaml.safe_dump(params))
    with pytest.raises(SystemExit) as exit_info:
        main(
            ["--params", str(no_teacher), "--processed", args[args.index("--processed") + 1]]
            + ["--method", "tsdae", "distill+contrastive", "--work", str(tmp_path / "work")]
        )
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "retrain.method distill+contrastive" in err
    assert "teacher.model is none" in err and not (tmp_path / "work").exists()
