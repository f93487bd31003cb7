"""The training loop and the three stages on a tiny model: determinism, accumulation, selection, records."""

from __future__ import annotations

import csv
import json

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from sentcl.model.encoder import Encoder
from sentcl.training.data import nli_triplets
from sentcl.training.trainer import Trainer
from stages.training import stage_config
from stages.transfer import STAGE_KEYS
from tests.paths import ROOT
from tests.tiny import make_tiny_encoder, tiny_sentences, train_config, write_tiny_processed

TEXTS = tiny_sentences(64, seed=1)
DEV = [(TEXTS[i], TEXTS[i + 1], float(i % 5)) for i in range(0, 40, 2)]
NLI = [(TEXTS[i], TEXTS[(i * 7 + 3) % 64], i % 3) for i in range(48)]


def fit(model_dir, examples=TEXTS, **config) -> tuple[Encoder, object]:
    encoder = Encoder.from_pretrained(str(model_dir))
    values = {
        "steps": 4,
        "batch_size": 8,
        "eval_steps": 2,
        "lr": 1e-3,
        "patience": 3,
        "min_delta": 0.0,
        **config,
    }
    result = Trainer(encoder, train_config(**values), examples, DEV, progress=False).fit()
    return encoder, result


def train_steps(model_dir, n: int, examples=TEXTS, **config) -> dict[str, torch.Tensor]:
    """The weights after ``n`` optimizer steps, without checkpoint selection."""
    encoder = Encoder.from_pretrained(str(model_dir))
    values = {"steps": n, "batch_size": 8, "lr": 1e-3, "warmup_ratio": 0, **config}
    trainer = Trainer(encoder, train_config(**values), examples, DEV, progress=False)
    for step in range(n):
        trainer.train_step(trainer._rank_items(trainer.order.indices(step)), step + 1)
    return weights(encoder)


def weights(encoder: Encoder) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in encoder.model.state_dict().items()}


def assert_same_weights(a: dict, b: dict, atol: float = 0.0) -> None:
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=atol, rtol=0, msg=key)


def test_same_seed_same_weights(tiny_model):
    a = train_steps(tiny_model, 3, views=("shuffle", "token_cutoff"))
    b = train_steps(tiny_model, 3, views=("shuffle", "token_cutoff"))
    c = train_steps(tiny_model, 3, views=("shuffle", "token_cutoff"), seed=7)
    assert_same_weights(a, b)
    assert any(not torch.equal(v, c[k]) for k, v in a.items())


@pytest.mark.parametrize(
    "mode,examples,views",
    [("transfer", TEXTS, ("none", "none")), ("joint", NLI, ("none", "none")), ("nli", NLI, ("none", "none"))],
)
def test_grad_accumulation_equals_one_large_batch(still_model, mode, examples, views):
    # fp32 pinned: an fp32 tolerance, whatever `train.bf16: auto` picks on this CPU (test_precision.py has the
    # bf16 counterpart).
    whole = train_steps(still_model, 3, examples, mode=mode, views=views, bf16=False)
    accumulated = train_steps(still_model, 3, examples, mode=mode, views=views, grad_accum=4, bf16=False)
    assert_same_weights(whole, accumulated, atol=1e-5)
    init = weights(Encoder.from_pretrained(str(still_model)))
    assert any(not torch.allclose(v, init[k]) for k, v in whole.items())


def test_a_run_that_never_beats_its_init_returns_the_init(tiny_model):
    encoder, result = fit(tiny_model, lr=0.0)
    assert not result.beat_init and result.best_step == 0 and result.metrics()["beat_init"] is False
    assert result.best_score == result.init_score
    assert_same_weights(weights(encoder), weights(Encoder.from_pretrained(str(tiny_model))))


def test_selection_keeps_the_best_evaluation_and_stops_early(tiny_model):
    encoder, result = fit(tiny_model, steps=40, eval_steps=2, patience=2, lr=5e-3)
    scores = [r["stsb_dev"] for r in result.rows if r["stsb_dev"] is not None]
    assert result.best_score == max(scores) and result.rows[0]["step"] == 0
    from sentcl.evaluation.sts import STSEvaluator

    rescored = STSEvaluator(DEV)(lambda s: encoder.encode(s, pooling="last-avg"))
    assert rescored == pytest.approx(result.best_score, abs=1e-4)  # the encoder holds the selected weights


def test_patience_stops_a_run_whose_evaluations_never_count_as_better(tiny_model):
    # min_delta 100: no evaluation can beat the init by that, so the run stops after `patience` evaluations
    encoder, result = fit(tiny_model, steps=40, eval_steps=2, patience=2, min_delta=100.0)
    assert result.stopped_early and result.steps == 4
    assert [r["step"] for r in result.rows if r["stsb_dev"] is not None] == [0, 2, 4]
    assert result.best_step == 0 and not result.beat_init
    assert_same_weights(weights(encoder), weights(Encoder.from_pretrained(str(tiny_model))))


def test_non_finite_loss_names_the_step(tiny_model):
    with pytest.raises(FloatingPointError, match="step 1"):
        fit(tiny_model, temperature=1e-40)  # cosine / t overflows fp32


@pytest.mark.parametrize(
    "mode,views,extra",
    [
        ("joint", ("none", "adversarial"), {"grad_accum": 2}),
        ("joint", ("span", "cutoff_paper_span"), {"queue_size": 16}),
        ("transfer", ("word_repetition", "dropout"), {"queue_size": 16}),
        ("transfer", ("token_cutoff", "feature_cutoff"), {"grad_accum": 2, "projection": True}),
    ],
)
def test_every_view_trains_in_its_modes(tiny_model, mode, views, extra):
    _, result = fit(tiny_model, NLI if mode == "joint" else TEXTS, mode=mode, views=views, steps=2, **extra)
    assert result.steps == 2 and all(np.isfinite(r["loss"]) for r in result.rows[1:])


def test_every_preset_and_objective_trains(tiny_model):
    """Two steps of each move the encoder's layers (checkpoint selection left out: a tiny model may keep its init)."""
    init = weights(Encoder.from_pretrained(str(tiny_model)))
    triplets = [(a, b, c) for (a, b, _), (_, c, _) in zip(NLI[::2], NLI[1::2], strict=True)]
    for examples, config in (
        (TEXTS, {"mode": "transfer", "preset": "simcse"}),
        (TEXTS, {"mode": "transfer", "preset": "esimcse"}),
        (triplets, {"mode": "nli", "objective": "sup_simcse"}),
        (NLI, {"mode": "nli"}),
    ):
        after = train_steps(tiny_model, 2, examples, **config)
        moved = [n for n, w in after.items() if ".layer." in n and not torch.equal(w, init[n])]
        assert len(moved) > len([n for n in init if ".layer." in n]) // 2, config


def test_presets_set_their_papers_recipe_and_dropout_is_never_derived_from_views():
    simcse = train_config(preset="simcse", views=("shuffle", "token_cutoff"), encoder_dropout=False)
    assert (simcse.views, simcse.temperature, simcse.loss, simcse.encoder_dropout) == (
        ("none", "none"),
        0.05,
        "info_nce",
        True,
    )
    esimcse = train_config(preset="esimcse")
    assert esimcse.views == ("none", "word_repetition") and (esimcse.queue_size, esimcse.momentum) == (
        160,
        0.995,
    )
    assert train_config(views=("shuffle", "feature_cutoff"), encoder_dropout=True).encoder_dropout
    assert not train_config(views=("none", "none"), encoder_dropout=False).encoder_dropout


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"views": ("adversarial", "none")}, "joint mode only"),
        ({"batch_size": 1}, "batch_size: at least 2"),
        ({"temperature": 0.0}, "temperature: greater than 0"),
        ({"eval_steps": 0}, "eval_steps: at least 1"),
        ({"lr": -1e-5}, "lr: not negative"),
        ({"lr": "1e-05"}, r"lr: a number \(float\), got '1e-05'"),
        ({"steps": True}, r"steps: a number \(int\)"),
        ({"view": {"dropout": 1.5}}, r"view.dropout must be in \[0, 1\)"),
    ],
)
def test_out_of_range_values_stop_with_one_line(overrides, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train_config(**overrides)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("params.yaml: ")
    import re

    assert re.search(message, err), err


def test_unknown_key_names_the_key_and_its_section(capsys):
    from stages.training import stage_config
    from stages.transfer import STAGE_KEYS

    params = yaml.safe_load(open("params.yaml"))
    params["transfer"]["nli"]["viewz"] = ["none", "none"]
    with pytest.raises(SystemExit):
        stage_config(params, "transfer", {"mode": "transfer"}, "nli", STAGE_KEYS)
    assert capsys.readouterr().err.strip() == "params.yaml: transfer.nli: unknown key 'viewz'"
    params = yaml.safe_load(open("params.yaml"))
    del params["train"]["patience"]
    with pytest.raises(SystemExit):
        stage_config(params, "joint", {"mode": "joint"})
    assert capsys.readouterr().err.strip().endswith("no value for 'patience'")


def test_training_classes_repeat_no_default_of_params_yaml():
    """params.yaml is the only home of a default: the config dataclasses declare none of their own."""
    from dataclasses import MISSING, fields

    from sentcl.training.config import TrainConfig
    from sentcl.training.views import ViewConfig

    for kind in (TrainConfig, ViewConfig):
        with_default = [
            f.name for f in fields(kind) if f.default is not MISSING or f.default_factory is not MISSING
        ]
        assert with_default == [], (kind.__name__, with_default)


def test_nli_triplets_pair_entailment_with_contradiction():
    import pandas as pd

    frame = pd.DataFrame(
        {
            "premise": ["p", "p", "p", "q", "q"],
            "hypothesis": ["e", "n", "c", "e2", "n2"],
            "label": ["entailment", "neutral", "contradiction", "entailment", "neutral"],
        }
    )
    assert nli_triplets(frame) == [("p", "e", "c")]


def test_checkpoint_loads_with_sentence_transformers_and_automodel(tiny_model, tmp_path):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoTokenizer

    encoder, _ = fit(tiny_model, steps=2)
    encoder.save(tmp_path / "out")
    ours = encoder.encode(TEXTS[:10], pooling="last-avg")
    st = SentenceTransformer(str(tmp_path / "out"), device="cpu").encode(TEXTS[:10])
    np.testing.assert_allclose(st, ours, atol=1e-5)
    model, tokenizer = (
        AutoModel.from_pretrained(tmp_path / "out"),
        AutoTokenizer.from_pretrained(tmp_path / "out"),
    )
    batch = tokenizer(TEXTS[:10], padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1)
    np.testing.assert_allclose((hidden * mask).sum(1) / mask.sum(1), ours, atol=1e-5)


def test_the_three_stages_end_to_end(tmp_path):
    from stages import base, joint, pretrain_nli, transfer

    model = make_tiny_encoder(tmp_path / "hub")
    processed = write_tiny_processed(tmp_path / "processed")
    params = yaml.safe_load(open("params.yaml"))  # the project's defaults, shortened for a tiny model
    params["seed"], params["model"] = 1, {"name": str(model), "max_length": 32}
    params["train"].update(eval_steps=2, patience=3, device="cpu")
    params["pretrain_nli"].update(steps=4, batch_size=8, lr=1e-3)
    params["joint"].update(steps=4, batch_size=8, lr=1e-3, views=["none", "adversarial"])
    params["transfer"].update(steps=4, batch_size=16, lr=1e-3, max_texts=40, eval_steps=2)
    params["transfer"]["nli"]["steps"] = params["transfer"]["joint"]["steps"] = 4  # 0 on the CPU profile
    params["transfer"]["base"]["objective"] = (
        "contrastive"  # distillation end to end: tests/unit/training/test_distill.py
    )
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    models, metrics, checkpoints = tmp_path / "models", tmp_path / "metrics", tmp_path / "checkpoints"
    common = ["--params", str(tmp_path / "params.yaml"), "--processed", str(processed)]
    common += [
        "--models-dir",
        str(models),
        "--metrics-dir",
        str(metrics),
        "--checkpoints-dir",
        str(checkpoints),
    ]
    base.main(["--params", str(tmp_path / "params.yaml"), "--output", str(models / "base")])
    pretrain_nli.main(common)
    joint.main(common)
    for init in ("base", "nli", "joint"):
        transfer.main([*common, "--init", init])
    domain = tmp_path / "domain.txt"
    domain.write_text("\n".join(tiny_sentences(30, seed=5)))
    transfer.main(
        [*common, "--init", str(models / "nli"), "--texts", str(domain), "--output", str(tmp_path / "custom")]
    )

    for name in ("nli", "joint", "transfer-base", "transfer-nli", "transfer-joint"):
        assert Encoder.from_pretrained(str(models / name)).encode(["a man"]).shape == (1, 32)
        record = json.loads((metrics / "train" / f"{name}.json").read_text())
        assert {"stsb_dev_step0", "stsb_dev_best", "best_step", "beat_init", "steps"} <= set(record)
        # A DVC metric (issue 14): no wall time, scores to 2 decimals (Spearman x 100).
        assert "seconds" not in record and record["stsb_dev_best"] == round(record["stsb_dev_best"], 2)
        rows = list(csv.DictReader(open(metrics / "curves" / f"{name}.csv")))
        assert rows[0]["step"] == "0" and rows[0]["stsb_dev"] != ""
        assert [r["step"] for r in rows if r["stsb_dev"]] == ["0", "2", "4"][
            : len([r for r in rows if r["stsb_dev"]])
        ]
    assert json.loads((metrics / "train" / "transfer-base.json").read_text())["examples"] == 40
    assert json.loads((metrics / "train" / "transfer-custom.json").read_text())["examples"] == 30
    assert (tmp_path / "custom" / "modules.json").is_file()
    # Each stage's seen text: every NLI sentence for nli and joint, the 40 sampled sentences, the domain file.
    nli = pd.read_parquet(processed / "nli.parquet")
    for name in ("nli", "joint"):
        lines = (metrics / "seen" / f"{name}.txt").read_text().splitlines()
        assert lines == sorted(set(nli.premise) | set(nli.hypothesis))
    assert len((metrics / "seen" / "transfer-base.txt").read_text().splitlines()) == 40
    custom = (metrics / "seen" / "transfer-custom.txt").read_text().splitlines()
    assert custom == sorted(set(domain.read_text().splitlines()))
    assert not (models / "nli" / "seen").exists()
    assert not checkpoints.exists() or not any(checkpoints.iterdir())  # resume state removed on completion


def test_paper_profile_flags_are_consert_recipes_and_new_keys_append():
    from sentcl.params import read_params
    from stages.common import ROOT
    from stages.profile import set_flags

    flags = set_flags(ROOT / "profiles" / "paper.yaml", read_params())
    assert "-S=transfer.lr=5e-07" in flags and '-S=transfer.base.views=["feature_cutoff","shuffle"]' in flags
    assert (
        "-S=transfer.base.encoder_dropout=false" in flags and "-S=transfer.nli.encoder_dropout=true" in flags
    )
    assert "-S=+transfer.base.steps=9300" in flags  # not in params.yaml: DVC's append syntax
    assert '-S=transfer.base.objective="contrastive"' in flags
    assert "-S=joint.view.token_cutoff=0.1" in flags and '-S=transfer.texts="consert"' in flags


def test_no_cpu_default_in_a_stage_section_shadows_a_profiles_train_setting():
    """A stage's section wins over `train`: a key params.yaml sets in a stage section (transfer.eval_steps for the
    CPU profile) would silently beat a profile's `train` value unless the profile sets that section's key too."""
    from sentcl.params import merge
    from stages.common import ROOT

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    stages = ("pretrain_nli", "joint", "transfer")
    for path in sorted((ROOT / "profiles").glob("*.yaml")):
        profile = yaml.safe_load(path.read_text())
        merged = merge(params, profile)
        for key, value in (profile.get("train") or {}).items():
            for stage in stages:
                if key in params[stage]:
                    assert merged[stage][key] == profile.get(stage, {}).get(key, value), (
                        path.name,
                        stage,
                        key,
                    )


def test_every_profile_runs_two_steps_on_a_tiny_model(tmp_path, monkeypatch):
    """`stages.profile --smoke`: a profile meant for a GPU still builds valid configs and trains."""
    from stages import profile
    from stages.common import load_params

    monkeypatch.setenv("SENTCL_MLFLOW", "0")
    model = make_tiny_encoder(tmp_path / "hub")
    processed = write_tiny_processed(tmp_path / "processed")
    profiles = sorted((ROOT / "profiles").glob("*.yaml"))
    assert profiles
    for path in profiles:
        work = tmp_path / path.stem
        work.mkdir()
        records = profile.smoke(path, load_params(), model, processed, profile.SHARED_MIRROR, work)
        stages = ["joint", "nli", "transfer-base", "transfer-joint", "transfer-nli"]
        assert sorted(records) == stages, path.name
        for stage, record in records.items():
            assert record["steps"] == 2 and record["trained"]["steps"] == 2, (path.name, stage)
        models = work / "models"
        assert all((models / name / "config.json").is_file() for name in ("nli", "joint", "transfer-base"))


def test_sweep_cells_change_the_views_of_one_recipe_and_keep_its_dropout():
    from sentcl.evaluation.analysis_runs import sweep_params
    from stages.common import load_params

    params = load_params()
    cells = [
        sweep_params(params, {"views": [v, "none"], "max_texts": 2000}, 30) for v in ("shuffle", "dropout")
    ]
    configs = [stage_config(p, "transfer", {"mode": "transfer"}, "base", STAGE_KEYS) for p in cells]
    assert [c.views for c in configs] == [("shuffle", "none"), ("dropout", "none")]
    assert all(c.objective == "contrastive" for c in configs)  # the pipeline's base recipe distils
    assert {c.encoder_dropout for c in configs} == {params["transfer"]["base"]["encoder_dropout"]}
    assert all(c.steps == 30 for c in configs) and cells[0]["transfer"]["max_texts"] == 2000
    # STS-B dev only at the start and the end, whatever params.yaml's transfer section says
    assert all(c.eval_steps == 30 and c.patience == 1 for c in configs)


def test_aug_grid_single_cells_are_each_view_with_itself_and_with_none():
    from sentcl.evaluation.analysis_runs import GRID_VIEWS, grid_pairs

    assert len(grid_pairs(GRID_VIEWS, "all")) == 25
    single = grid_pairs(GRID_VIEWS, "single")
    assert ("none", "none") in single and ("token_cutoff", "token_cutoff") in single
    assert ("token_cutoff", "none") in single and ("none", "token_cutoff") not in single
    assert ("shuffle", "token_cutoff") not in single and len(single) == 9


def test_a_stage_with_zero_steps_writes_its_init_untrained(tmp_path, monkeypatch):
    """steps 0 (a stage the default profile does not train): the output holds the init's weights, the record says
    why, no sentence is recorded as seen, and no training ran."""
    from stages import pretrain_nli

    monkeypatch.setenv("SENTCL_MLFLOW", "0")
    init = make_tiny_encoder(tmp_path / "hub")
    processed = write_tiny_processed(tmp_path / "processed")
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["pretrain_nli"]["steps"] = 0
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    metrics = tmp_path / "metrics"
    pretrain_nli.main(
        [
            *("--params", str(tmp_path / "params.yaml"), "--processed", str(processed), "--init", str(init)),
            *("--output", str(tmp_path / "nli"), "--metrics-dir", str(metrics)),
        ]
    )
    before, after = (weights(Encoder.from_pretrained(str(p))) for p in (init, tmp_path / "nli"))
    assert_same_weights(before, after)
    record = json.loads((metrics / "train" / "nli.json").read_text())
    assert record["steps"] == 0 and record["trained"] is None and "steps 0" in record["not_trained"]
    assert (metrics / "seen" / "nli.txt").read_text() == ""
    assert list(csv.reader((metrics / "curves" / "nli.csv").open())) == [["step", "loss", "lr", "stsb_dev"]]
