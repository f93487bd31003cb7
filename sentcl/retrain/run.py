"""A retrain, executed: :func:`run` takes a :class:`~sentcl.retrain.plan.Plan` and a runner (what runs one stage:
a Prefect task in the flow, a subprocess with tracking off in a benchmark) and returns what it found.

Without scored dev pairs, a method that distils holds a share of the text out first (never trained on, read by
no teacher but for its agreement pairs). With a teacher, the teacher stage runs before any training; with dev
pairs, a teacher not better than the student by ``registry.min_delta`` ends the retrain untrained ("teacher not
better"). Then one transfer per objective, each from the previous one's output.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sentcl.registry.rules import DEV_GUARDS
from sentcl.retrain.agreement import hold_out_file
from sentcl.retrain.plan import Plan, Step, teacher_not_better

Runner = Callable[[Step], object]  # runs one stage; a failure raises


@dataclass
class Outcome:
    status: str  # "trained" | "teacher not better" | "no gain" (no run beat its init)
    selected_on: str  # domain_dev | teacher_agreement | stsb_dev
    runs: list[dict[str, Any]]  # each transfer's record, with its stage, objective and output folder
    texts: Path  # what the runs trained on
    heldout: dict[str, int] | None = None  # sentences held out, trained on, agreement pairs
    teacher: dict[str, Any] | None = None  # the teacher check: model, scores, nothing_to_distil
    pairs: Path | None = (
        None  # the scored pairs selection read (the domain's, or the agreement pairs): the gate's
    )

    def summary(self) -> dict[str, Any]:
        """What a retrain's result says of it: the selection, each run in short, the held-out share, the teacher."""
        keys = ("objective", "init", "best_step", "steps", "beat_init", "selected_on")
        found = {"selected_on": self.selected_on, "runs": [{k: r.get(k) for k in keys} for r in self.runs]}
        return found | {
            k: v for k, v in (("heldout", self.heldout), ("teacher", self.teacher)) if v is not None
        }

    @property
    def winner(self) -> dict[str, Any] | None:
        """The last run that beat its init: it holds the final weights (a later run that did not returned them)."""
        return next((r for r in reversed(self.runs) if r.get("beat_init")), None)


def run(plan: Plan, runner: Runner, say: Callable[[str], object] = print) -> Outcome:
    """Execute ``plan``, each stage by ``runner``; ``say`` gets the lines a person reads."""
    outcome = Outcome("trained", "domain_dev" if plan.domain_dev else "stsb_dev", [], plan.text)
    outcome.pairs = plan.domain_dev
    held = 0
    if plan.hold_out:  # no labels: hold out a share before the teacher reads the text
        kept, held = hold_out_file(
            plan.text, plan.training_text, plan.heldout_file, plan.agreement, plan.seed
        )
        outcome.heldout = {"sentences": held, "trained_on": kept, "agreement_pairs": 0}
        outcome.texts = plan.training_text
        say(f"no --domain-dev: {held} of {kept + held} sentences held out, never trained on")
    agreement = None
    if plan.teacher:
        outcome.teacher = check_teacher(plan, runner, bool(held), say)
        if outcome.teacher.get("nothing_to_distil"):
            outcome.status = "teacher not better"
            return outcome
        if outcome.teacher.get("agreement"):
            agreement = outcome.pairs = plan.agreement_file()
            outcome.heldout["agreement_pairs"] = outcome.teacher["agreement"]["pairs"]
            outcome.selected_on = "teacher_agreement"
    model = plan.init
    for index, objective in enumerate(
        plan.objectives
    ):  # tsdae+contrastive: the second from the first's output
        step = plan.transfer_step(index, model, agreement)
        runner(step)
        record = json.loads(step.record.read_text())
        outcome.runs.append(
            {"stage": step.name, "objective": objective, "output": str(step.output), **record}
        )
        model = str(step.output)
    if outcome.winner is None:  # the candidate would be the init itself: registering it teaches nothing
        outcome.status = "no gain"
        say(
            f"no step of {plan.method} beat its init ({plan.init_label}): the candidate is the init itself; "
            "nothing registered"
        )
    return outcome


def check_teacher(plan: Plan, runner: Runner, heldout: bool, say: Callable[[str], object]) -> dict[str, Any]:
    """The teacher stage, and teacher against student on the domain dev pairs: ``nothing_to_distil`` (the one
    line, said) when the teacher is not better by ``registry.min_delta``."""
    step = plan.teacher_step(heldout)
    runner(step)
    record = json.loads(step.record.read_text())
    scores = record.get("domain_dev")
    if scores is None:
        say(f"no --domain-dev pairs: teacher {plan.teacher} is not checked against the student")
        return {
            "model": plan.teacher,
            **({"agreement": record["agreement"]} if "agreement" in record else {}),
        }
    line = teacher_not_better(plan.teacher, scores["teacher"], scores["student"], plan.min_delta)
    if line:
        say(line)
    return {"model": plan.teacher, **scores, "nothing_to_distil": line}


def score_candidates(
    plan: Plan, outcome: Outcome, init: dict[str, Any], raw: Path, runner: Runner
) -> dict[str, str]:
    """The candidates a gate picks from (name -> folder: the last run that beat its init, and the init) scored
    in ``work/candidates.json``: the init by the evaluate stage beside the run, unless its registered scores
    (``init["sts_row"]``) hold every dev guard already (the same protocol: not run again)."""
    name, row, winner = ("champion" if init["version"] else "base"), init["sts_row"], outcome.winner
    models = {winner["stage"]: winner["output"], name: init["folder"]}
    # Re-scored when its registered scores lack a dev guard (a version registered before the gate read it).
    rescore = row is None or not row.get("all") or any(row.get(guard) is None for guard in DEV_GUARDS)
    step = plan.evaluate_step(models if rescore else {winner["stage"]: winner["output"]}, raw)
    runner(step)
    scores = json.loads(step.record.read_text())
    scores.setdefault(name, row)
    (plan.work / "candidates.json").write_text(json.dumps(scores, indent=2) + "\n")
    return models


def describe_gate(result: dict[str, Any]) -> str:
    """The lines a gated retrain ends with: the candidate, its version, the gate's decision and reasons (the
    export stage's summary)."""
    gate = result.get("gate") or {}
    domain = f", domain {result['domain_spearman']:.2f}" if "domain_spearman" in result else ""
    lines = [
        f"retrain: candidate {result.get('checkpoint')} stsb_dev {result.get('stsb_dev', float('nan')):.2f}"
        f"{domain}, registered version {result.get('registered_version')}",
        f"retrain: gate {gate.get('decision', 'no verdict yet')}; champion is version {gate.get('champion_after')}",
    ]
    return "\n".join(lines + [f"  - {r}" for r in gate.get("reasons", [])])
