"""A retrain executed (sentcl.retrain.run): the teacher check before any training, with the stage itself run by
a runner as the benchmark runs it (a subprocess, tracking off)."""

from __future__ import annotations

import os
import subprocess

import yaml

from sentcl.params import read_params
from sentcl.retrain.config import RetrainConfig
from sentcl.retrain.plan import Plan, Step, plan
from sentcl.retrain.run import Outcome, run
from tests.paths import ROOT
from tests.tiny import tiny_sentences, write_tiny_processed


def run_as_subprocesses(todo: Plan) -> tuple[Outcome, list[Step], list[str]]:
    """``run(todo)``, each stage a subprocess with tracking off (as the benchmark runs it); the stages run and
    the lines said."""
    ran: list[Step] = []
    said: list[str] = []

    def runner(step: Step) -> None:
        ran.append(step)
        env = dict(os.environ, SENTCL_MLFLOW="0", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
        subprocess.run(step.command, cwd=ROOT, env=env, check=True, capture_output=True)

    return run(todo, runner, said.append), ran, said


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
    outcome, ran, said = run_as_subprocesses(todo)
    assert [s.name for s in ran] == ["teacher"] and outcome.runs == [] and outcome.winner is None
    assert outcome.status == "teacher not better" and outcome.selected_on == "domain_dev"
    assert outcome.heldout is None and outcome.selection_pairs == outcome.gate_pairs == dev  # labelled
    teacher = outcome.teacher
    assert teacher["model"] == str(tiny_model) and abs(teacher["teacher"] - teacher["student"]) < 0.5
    assert said == [teacher["nothing_to_distil"]] and "nothing to distil" in said[0]
    assert not (tmp_path / "w" / "models").exists()


def test_without_dev_pairs_selection_and_the_gate_read_disjoint_parts_of_the_held_out_text(
    tiny_model, tmp_path
):
    """The label-free path: the held-out share is split before any pair is built; the transfer stage selects on
    the pairs within the selection part, the gate is handed the pairs within the other part, and no sentence
    (by sentcl.data.roles.normalise: the text repeats some in another case and punctuation) is in both."""
    from sentcl.data.roles import normalise
    from tests.unit.training.test_distill import make_tiny_teacher

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["model"]["name"] = str(tiny_model)
    params["teacher"].update(model=str(make_tiny_teacher(tmp_path)), backend="torch")
    params["train"].update(eval_steps=1, device="cpu", bf16=False)
    params["retrain"]["heldout_share"] = 0.4
    params["retrain"]["transfer"]["distillation"].update(
        steps=2, eval_steps=1
    )  # every layer trains, as retrains do
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    settings = read_params(tmp_path / "params.yaml")
    sentences = tiny_sentences(60, seed=4)
    variants = [s.upper() + " ." for s in sentences[:20]]  # the same sentences, by the project's rule
    text = tmp_path / "texts-in.txt"
    text.write_text("\n".join(sentences + variants) + "\n")
    work = tmp_path / "w"
    todo = plan(
        RetrainConfig.from_params(settings, "distill"),
        settings,
        text,
        str(tiny_model),
        work,
        "r",
        write_tiny_processed(tmp_path / "processed"),
    )
    outcome, ran, said = run_as_subprocesses(todo)

    def keys(path):
        return {normalise(s) for s in path.read_text().splitlines()}

    def pair_keys(path):
        rows = [line.split("\t") for line in path.read_text().splitlines()]
        return {normalise(s) for a, b, _ in rows for s in (a, b)}, len(rows)

    selection, gate = keys(work / "heldout-selection.txt"), keys(work / "heldout-gate.txt")
    trained = keys(work / "texts.txt")
    assert selection and gate and not selection & gate  # two parts, no sentence in both
    assert not (selection | gate) & trained  # and neither trained on, variants included
    assert selection | gate | trained == {normalise(s) for s in sentences}
    selection_pairs = work / "teacher" / "agreement-selection.tsv"
    gate_pairs = work / "teacher" / "agreement-gate.tsv"
    (selection_read, n_selection), (gate_read, n_gate) = pair_keys(selection_pairs), pair_keys(gate_pairs)
    assert selection_read <= selection and gate_read <= gate  # pairs built within each part
    # The transfer stage was handed the selection part's pairs; the gate is handed the gate part's.
    assert [s.name for s in ran] == ["teacher", "r-distill"]
    command = ran[1].command
    assert command[command.index("--agreement") + 1] == str(selection_pairs)
    assert str(gate_pairs) not in command and str(gate_pairs) not in ran[0].command
    assert (
        outcome.selected_on == "teacher_agreement" and outcome.runs[0]["selected_on"] == "teacher_agreement"
    )
    assert outcome.runs[0]["agreement_pairs"] == n_selection  # what the transfer stage read: its part only
    assert (outcome.selection_pairs, outcome.gate_pairs) == (selection_pairs, gate_pairs)
    assert todo.register_step({}, outcome.gate_pairs).command.count(str(gate_pairs)) == 1
    judged = outcome.summary()["judged_on"]
    assert judged["selection"] == {
        "part": "heldout_selection",
        "file": str(selection_pairs),
        "pairs": n_selection,
        "sentences": len(selection_read),
    }
    assert judged["gate"] == {
        "part": "heldout_gate",
        "file": str(gate_pairs),
        "pairs": n_gate,
        "sentences": len(gate_read),
    }
    assert judged["shared_sentences"] == 0
    held = len((work / "heldout-selection.txt").read_text().splitlines()) + len(
        (work / "heldout-gate.txt").read_text().splitlines()
    )
    assert outcome.heldout["sentences"] == held and f"{held} of 80 sentences held out" in said[0]
