"""What a retrain plans before anything runs (sentcl.retrain.plan): the runs, the selection data, the teacher
check, and every stage's command line with the retrain's params (retrain.transfer over transfer)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sentcl.params import read_params
from sentcl.retrain.config import RetrainConfig
from sentcl.retrain.plan import plan, teacher_not_better


def flags(command: list[str]) -> dict[str, list[str]]:
    """A command line's flags, each with its values (a repeated flag keeps every value)."""
    found: dict[str, list[str]] = {}
    for i, part in enumerate(command):
        if part.startswith("--"):
            value = command[i + 1] if i + 1 < len(command) and not command[i + 1].startswith("--") else ""
            found.setdefault(part, []).append(value)
    return found


@pytest.fixture
def params(tmp_path):
    path = tmp_path / "own.yaml"
    path.write_text(Path(read_params().file).read_text())
    # the retrain's own transfer overlay set here, so the commands below are checked against values this test
    # chose rather than whatever params.yaml holds today
    return read_params(
        path,
        [
            "seed=7",
            "retrain.transfer.max_texts=1234",
            "retrain.transfer.distillation.steps=37",
            "retrain.transfer.distillation.lr=0.0003",
            "retrain.transfer.distillation.layer_lr_decay=0.9",
        ],
    )


def test_a_labelled_distill_retrain_checks_the_teacher_and_selects_on_the_dev_pairs(params, tmp_path):
    config = RetrainConfig.from_params(params, "distill+contrastive")
    todo = plan(
        config,
        params,
        tmp_path / "texts.txt",
        "/m/init",
        tmp_path / "w",
        "retrain-ab",
        None,
        tmp_path / "dev.tsv",
    )
    assert (todo.objectives, todo.selection, todo.hold_out, todo.teacher) == (
        ("distill", "contrastive"), "domain_dev", False, params["teacher"]["model"],
    )  # fmt: skip
    assert todo.seed == 7 and todo.training_text == tmp_path / "texts.txt"
    teacher = todo.teacher_step()
    assert teacher.command[:3] == [sys.executable, "-m", "stages.teacher"]
    got = flags(teacher.command)
    # the same file and overrides as this process, then the retrain's own overlay over transfer
    assert got["--params"] == [str(params.file)]
    assert got["--set"] == [
        "seed=7",
        "retrain.transfer.max_texts=1234",
        "retrain.transfer.distillation.steps=37",
        "retrain.transfer.distillation.lr=0.0003",
        "retrain.transfer.distillation.layer_lr_decay=0.9",
        "transfer.max_texts=1234",
        "transfer.distillation.steps=37",
        "transfer.distillation.freeze=[]",
        "transfer.distillation.lr=0.0003",
        "transfer.distillation.layer_lr_decay=0.9",
    ]
    assert got["--domain-dev"] == [str(tmp_path / "dev.tsv")] and got["--student"] == ["/m/init"]
    assert "--heldout" not in got and "--heldout-gate" not in got and "--processed" not in got
    assert teacher.record == tmp_path / "w" / "teacher" / "teacher.json"
    first = todo.transfer_step(0, "/m/init", None)
    second = todo.transfer_step(1, str(first.output), None)
    assert (first.name, second.name) == ("retrain-ab-distill", "retrain-ab-distill-contrastive")
    got = flags(first.command)
    assert got["--init"] == ["/m/init"] and got["--objective"] == ["distill"]
    assert got["--teacher-vectors"] == [str(tmp_path / "w" / "teacher")] and "--agreement" not in got
    assert got["--domain-dev"] == [str(tmp_path / "dev.tsv")] and "--steps" not in got
    got = flags(second.command)
    assert got["--init"] == [str(first.output)] and "--teacher-vectors" not in got
    assert second.record == tmp_path / "w" / "metrics" / "train" / "retrain-ab-distill-contrastive.json"


def test_without_dev_pairs_a_distill_retrain_holds_out_a_share_and_selects_on_agreement(params, tmp_path):
    config = RetrainConfig.from_params(params, "distill")
    todo = plan(
        config, params, tmp_path / "t.txt", "/m", tmp_path, "x", tmp_path / "data", steps={"distill": 4}
    )
    assert (todo.hold_out, todo.selection) == (True, "teacher_agreement")
    assert todo.training_text == tmp_path / "texts.txt" != todo.text  # the rest of the text, written by run
    # Two parts of the held-out share, each its own file and its own agreement pairs.
    assert todo.heldout_files == {
        "selection": tmp_path / "heldout-selection.txt",
        "gate": tmp_path / "heldout-gate.txt",
    }
    got = flags(todo.teacher_step(("selection", "gate")).command)
    assert got["--heldout"] == [str(tmp_path / "heldout-selection.txt")] and "--domain-dev" not in got
    assert got["--heldout-gate"] == [str(tmp_path / "heldout-gate.txt")]
    assert got["--processed"] == [str(tmp_path / "data")] and got["--texts"] == [str(tmp_path / "texts.txt")]
    assert "--heldout-gate" not in flags(todo.teacher_step(("selection",)).command)
    # Selection reads the selection part's pairs; the gate (the export stage) the gate part's, nothing else.
    got = flags(todo.transfer_step(0, "/m", todo.agreement_file("selection")).command)
    assert got["--agreement"] == [str(tmp_path / "teacher" / "agreement-selection.tsv")]
    assert got["--steps"] == ["4"]
    gate = todo.agreement_file("gate")
    assert gate == tmp_path / "teacher" / "agreement-gate.tsv"
    got = flags(todo.export_step({"x-distill": "/o"}, tmp_path / "raw", gate).command)
    assert got["--domain-dev"] == [str(gate)]
    assert flags(todo.register_step({}, gate).command)["--domain-dev"] == [str(gate)]


def test_a_method_without_a_teacher_selects_on_stsb_dev_without_labels(params, tmp_path):
    todo = plan(RetrainConfig.from_params(params, "tsdae"), params, tmp_path / "t.txt", "/m", tmp_path, "x")
    assert (todo.teacher, todo.hold_out, todo.selection, todo.training_text) == (
        None,
        False,
        "stsb_dev",
        tmp_path / "t.txt",
    )
    got = flags(todo.transfer_step(0, "/m", None).command)
    assert (
        "--teacher-vectors" not in got
        and "--domain-dev" not in got
        and got["--texts"] == [str(tmp_path / "t.txt")]
    )


def test_the_gate_steps_carry_the_candidates_tags_and_the_pairs_selection_read(params, tmp_path):
    todo = plan(RetrainConfig.from_params(params), params, tmp_path / "texts.txt", "/m", tmp_path, "x")
    got = flags(todo.evaluate_step({"x-distill": "/o", "base": "/m"}, tmp_path / "raw").command)
    assert got["--model"] == ["x-distill=/o", "base=/m"] and got["--output"] == [str(tmp_path / "sts.json")]
    step = todo.export_step({"x-distill": "/o", "champion": "/m"}, tmp_path / "raw", None)
    got = flags(step.command)
    assert got["--model"] == ["x-distill=/o", "champion=/m"] and "--domain-dev" not in got
    assert got["--output"] == [str(tmp_path / "export")] and not {"--tag", "--by", "--processed"} & set(got)
    # Registration is the register stage's: the folder export wrote, the run's tags, the gate's pairs.
    got = flags(todo.register_step({"a": "1", "trigger": "inbox"}, None).command)
    assert got["--release"] == [str(tmp_path / "export")] and got["--tag"] == ["a=1", "trigger=inbox"]
    assert "--domain-dev" not in got and todo.register_step({}, None).record == tmp_path / "registry.json"
    got = flags(todo.register_step({}, tmp_path / "dev.tsv").command)
    assert got["--domain-dev"] == [str(tmp_path / "dev.tsv")]


def test_a_teacher_must_beat_the_student_by_more_than_min_delta():
    assert teacher_not_better("t", 80.0, 79.0, 0.1) is None
    line = teacher_not_better("t", 79.1, 79.0, 0.1)
    assert line.startswith("teacher t scores 79.10 on the domain dev pairs, the student 79.00: not better")
    worse = teacher_not_better("t", 78.0, 79.0, 0.1)
    assert worse.startswith("teacher t scores 78.00 on the domain dev pairs, the student 79.00: not better")
