"""A training run by hand with `--output DIR` outside the models folder writes its records (curves, metrics,
resume state) beside DIR, never over the pipeline's git-tracked metrics/train and metrics/curves files."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from stages import base, training, transfer
from tests.paths import ROOT
from tests.tiny import make_tiny_encoder, write_tiny_processed


def test_a_transfer_with_output_outside_models_keeps_the_pipeline_records(tmp_path, monkeypatch):
    pipeline_metrics, pipeline_checkpoints = tmp_path / "metrics", tmp_path / "checkpoints"
    (pipeline_metrics / "train").mkdir(parents=True)
    tracked = pipeline_metrics / "train" / "transfer-base.json"
    tracked.write_text('{"stsb_dev_best": 87.41}\n')  # the pipeline's record, as committed
    monkeypatch.setattr(training, "METRICS", pipeline_metrics)
    monkeypatch.setattr(training, "CHECKPOINTS", pipeline_checkpoints)
    monkeypatch.setattr(training, "SEEN", tmp_path / "data" / "seen")

    models = tmp_path / "models"
    processed = write_tiny_processed(tmp_path / "processed")
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["model"] = {"name": str(make_tiny_encoder(tmp_path / "hub")), "max_length": 32}
    params["train"].update(eval_steps=1, device="cpu", bf16=False)
    params["transfer"].update(steps=1, batch_size=8, max_texts=16, eval_steps=1)
    params["transfer"]["base"]["objective"] = "contrastive"  # no teacher vectors here
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    out = tmp_path / "sweep" / "lr-fast"
    base.main(["--params", str(tmp_path / "params.yaml"), "--output", str(models / "base")])
    argv = ["--init", "base", "--params", str(tmp_path / "params.yaml"), "--processed", str(processed)]
    transfer.main([*argv, "--models-dir", str(models), "--output", str(out)])

    assert tracked.read_text() == '{"stsb_dev_best": 87.41}\n'
    assert not (pipeline_metrics / "curves").exists() and not pipeline_checkpoints.exists()
    records = tmp_path / "sweep" / "lr-fast.records"
    assert json.loads((records / "train" / "transfer-base.json").read_text())["steps"] == 1
    assert (records / "curves" / "transfer-base.csv").is_file()
    # The sentences it trained on (max_texts 16 distinct ones) beside its records, not in the pipeline's data/seen.
    assert len(set((records / "seen" / "transfer-base.txt").read_text().splitlines())) == 16
    assert not (tmp_path / "data").exists()
    assert (out / "modules.json").is_file()


def test_inside_the_models_folder_or_with_explicit_folders_the_records_go_where_asked(tmp_path):
    parser = training.stage_parser("")
    models = tmp_path / "models"
    inside = parser.parse_args(["--models-dir", str(models), "--output", str(models / "transfer-base")])
    assert training.records_dirs(inside) == (training.METRICS, training.CHECKPOINTS)
    explicit = parser.parse_args(
        ["--output", str(tmp_path / "x"), "--metrics-dir", str(tmp_path / "m"), "--checkpoints-dir", "c"]
    )
    assert training.records_dirs(explicit) == (tmp_path / "m", Path("c"))
