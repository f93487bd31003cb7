"""sentcl_mlflow.store / .runs: where runs go, what a stage run records, fail-fast on a dead server."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from sentcl.data.domain import DomainTextError, read_domain_text, read_scored_pairs
from sentcl.params import read_params
from sentcl_mlflow import runs, store
from tests.paths import ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------------ where runs go


def test_default_store_is_the_repository_root(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    assert store.tracking_uri() == f"sqlite:///{ROOT / 'mlflow.db'}"


def test_dvc_temp_experiment_writes_to_the_parent_store(monkeypatch):
    """`dvc exp run --temp` / queued runs execute in .dvc/tmp/exps/<dir> with DVC_ROOT set to the parent."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("DVC_ROOT", str(ROOT / ".dvc" / "tmp" / "exps" / "tmpab12cd"))
    assert store.repo_root() == ROOT
    assert store.tracking_uri() == f"sqlite:///{ROOT / 'mlflow.db'}"


def test_environment_variable_overrides(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    assert store.tracking_uri() == "http://127.0.0.1:5999"


# ------------------------------------------------------------------------------------------ what is logged


def test_flatten_and_sts_metric_names():
    assert runs.flatten({"a": {"b": 1, "c": [1, 2]}, "d": None}) == {
        "a.b": "1",
        "a.c": "[1, 2]",
        "d": "None",
    }
    row = {"all": {"STS12": 70.0, "SICK-R": 60.0, "avg": 65.0}, "mean": {"STS12": 71.0}, "stsb_dev": 80.0}
    assert runs.sts_metrics(row) == {
        "sts_sts12": 70.0,
        "sts_sick_r": 60.0,
        "sts_avg": 65.0,
        "sts_mean_sts12": 71.0,
        "stsb_dev": 80.0,
    }


def test_log_stage_records_params_curves_hashes_and_experiment(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("DVC_EXP_NAME", "exp-lr-1e5")
    curves = tmp_path / "curves.csv"
    curves.write_text("step,loss,lr,stsb_dev\n0,,,70.5\n10,2.5,1e-05,\n20,2.25,2e-05,75.25\n")
    data = tmp_path / "data.txt"
    data.write_text("a sentence\n")
    record = runs.StageRecord({"stsb_dev": 80.0, "best_step": 20}, curves, inputs=[data], artifacts=[curves])
    run_id = runs.log_stage(
        "transfer-base", {"transfer": {"lr": 3e-6, "views": ["shuffle"]}}, record, params=read_params()
    )
    run = MlflowClient(uri).get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["transfer.lr"] == "3e-06"
    assert run.data.params["transfer.views"] == '["shuffle"]'
    assert run.data.params["registry.model_name"] == "sentcl-encoder"  # the whole params.yaml, flattened
    assert run.data.metrics["stsb_dev"] == 80.0
    history = MlflowClient(uri).get_metric_history(run_id, "train/stsb_dev")
    assert [(m.step, m.value) for m in history] == [(0, 70.5), (20, 75.25)]
    assert [m.step for m in MlflowClient(uri).get_metric_history(run_id, "train/loss")] == [10, 20]
    tags = run.data.tags
    assert tags["dvc_exp_name"] == "exp-lr-1e5"
    assert len(tags["git_commit"]) == 40
    assert any(k.startswith("dvc.") and v.startswith("sha256:") for k, v in tags.items())
    assert [a.path for a in MlflowClient(uri).list_artifacts(run_id)] == ["curves.csv"]
    # Artifacts sit beside the store, not in ./mlruns of the current folder.
    assert run.info.artifact_uri.startswith((tmp_path / "mlartifacts").as_uri())


def test_dvc_hashes_come_from_dvc_lock(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "dvc.lock").write_text(
        "schema: '2.0'\nstages:\n  validate:\n    outs:\n    - path: data\n      md5: abc123.dir\n"
    )
    assert runs.dvc_hashes([Path("data")]) == {"data": "abc123.dir"}


def test_tracking_switch_off(monkeypatch):
    monkeypatch.setenv("SENTCL_MLFLOW", "0")
    assert runs.log_stage("x", {}, params={}) is None


def test_unreachable_server_fails_fast_with_a_clear_message(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setattr(store, "CONNECT_ATTEMPTS", 2)
    monkeypatch.setattr(store, "CONNECT_TIMEOUT_S", 1.0)
    started = time.monotonic()
    with pytest.raises(store.TrackingUnavailableError, match="unreachable after 2 attempts"):
        runs.log_stage("transfer-base", {"a": 1}, runs.StageRecord({"stsb_dev": 1.0}), params={"a": 2})
    assert time.monotonic() - started < 10


# ------------------------------------------------------------------------------------------ domain text


def test_domain_text_is_checked_before_training(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    with pytest.raises(DomainTextError, match="no usable text"):
        read_domain_text(empty)
    # A file alone that is not text: nothing usable, and the line says why.
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00")
    with pytest.raises(DomainTextError, match="no usable text.*blob.bin: not UTF-8 text .NUL bytes"):
        read_domain_text(binary)
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9 au lait\nun th\xe9\n".encode("latin-1"))
    with pytest.raises(DomainTextError, match="latin1.txt: not UTF-8 text .byte 3"):
        read_domain_text(latin)
    dupes = tmp_path / "dupes.txt"
    dupes.write_text("same line\nsame  line\nsame line\n")
    with pytest.raises(DomainTextError, match="1 distinct"):
        read_domain_text(dupes)
    # Long lines are kept and counted (the tokenizer truncates them, as every anchor does), not refused.
    long = tmp_path / "long.txt"
    long.write_text("short one\n" + "word " * 100 + "\n")
    text = read_domain_text(long, lambda s: len(s.split()) + 2, 64)
    assert text.too_long == [1] and text.summary()["truncated"] == 1 and len(text.sentences) == 2


def test_domain_text_folder_dedup_and_fingerprint(tmp_path):
    (tmp_path / "a.txt").write_text("one sentence\ntwo sentences\n")
    (tmp_path / "b.txt").write_text("two sentences\nthree sentences\n")
    text = read_domain_text(tmp_path)
    assert text.sentences == ["one sentence", "two sentences", "three sentences"]
    assert text.duplicates == 1
    assert text.sha256 == read_domain_text(tmp_path).sha256
    (tmp_path / "b.txt").write_text("two sentences\nfour sentences\n")
    assert text.sha256 != read_domain_text(tmp_path).sha256


def test_scored_pairs(tmp_path):
    dev = tmp_path / "dev.tsv"
    dev.write_text("sentence1\tsentence2\tscore\na\tb\t1\nc\td\t2.5\ne\tf\t4\n")
    assert read_scored_pairs(dev)[1] == ("c", "d", 2.5)
    dev.write_text("a\tb\n")
    with pytest.raises(DomainTextError, match="expected sentence1"):
        read_scored_pairs(dev)
