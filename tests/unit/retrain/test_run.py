"""A retrain executed (sentcl.retrain.run): the teacher check before any training, with the stage itself run by
a runner as the benchmark runs it (a subprocess, tracking off)."""

from __future__ import annotations

import os
import subprocess

import yaml

from sentcl.params import read_params
from sentcl.retrain.config import RetrainConfig
from sentcl.retrain.plan import Step, plan
from sentcl.retrain.run import run
from tests.paths import ROOT
from tests.tiny import tiny_sentences, write_tiny_processed


def test_a_teacher_no_better_than_the_student_ends_the_retrain_before_any_training(tiny_model, tmp_path):
    """The teacher is the starting model itself: the teacher stage runs, scores both, and nothing trains."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["model"]["name"] = str(tiny_model)
    params["teacher"].update(model=str(tiny_model), backend="torch")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    settings = read_params(tmp_path / "params.yaml")
    text = tmp_path / "texts.txt"
    text.write_text("\n".join(tiny_sentences(30, seed=4)) + "\n")
    sentences = tiny_sentences(12, seed=5)
    dev = tmp_path / "dev.tsv"
    dev.write_text("".join(f"{sentences[i]}\t{sentences[i + 1]}\t{i % 4}\n" for i in range(0, 12, 2)))
    processed = write_tiny_processed(tmp_path / "processed")
    todo = plan(
        RetrainConfig.from_params(settings, "distill"),
        settings,
        text,
        str(tiny_model),
        tmp_path / "w",
        "r",
        processed,
        dev,
    )
    ran: list[Step] = []

    def runner(step: Step) -> None:
        ran.append(step)
        env = dict(os.environ, SENTCL_MLFLOW="0", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
        subprocess.run(step.command, cwd=ROOT, env=env, check=True, capture_output=True)

    said: list[str] = []
    outcome = run(todo, runner, said.append)
    assert [s.name for s in ran] == ["teacher"] and outcome.runs == [] and outcome.winner is None
    assert outcome.status == "teacher not better" and outcome.selected_on == "domain_dev"
    assert outcome.heldout is None and outcome.pairs == dev  # labelled: nothing is held out
    teacher = outcome.teacher
    assert teacher["model"] == str(tiny_model) and abs(teacher["teacher"] - teacher["student"]) < 0.5
    assert said == [teacher["nothing_to_distil"]] and "nothing to distil" in said[0]
    assert not (tmp_path / "w" / "models").exists()
