"""A retrain, executed: :func:`run` takes a :class:`~sentcl.retrain.plan.Plan` and a runner (what runs one stage:
a Prefect task in the flow, a subprocess with tracking off in a benchmark) and returns what it found.

Without scored dev pairs, a method that distils holds a share of the text out first (never trained on, read by
no teacher but for its agreement pairs), in two parts: selection picks checkpoints on the pairs within one, the
gate judges on the pairs within the other, which selection never reads. With a teacher, the teacher stage runs
before any training; with dev pairs, a teacher not better than the student by ``registry.min_delta`` ends the
retrain untrained ("teacher not better"). Then one transfer per objective, each from the previous one's output.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sentcl.data.domain import read_scored_pairs
from sentcl.data.roles import sentence_keys
from sentcl.registry.rules import DEV_GUARDS
from sentcl.retrain.agreement import PARTS, hold_out_file
from sentcl.retrain.plan import Plan, Step, teacher_not_better

Runner = Callable[[Step], object]  # runs one stage; a failure raises


@dataclass
class Outcome:
    status: str  # "trained" | "teacher not better" | "no gain" (no run beat its init)
    selected_on: str  # domain_dev | teacher_agreement | stsb_dev
    runs: list[dict[str, Any]]  # each transfer's record, with its stage, objective and output folder
    texts: Path  # what the runs trained on
    heldout: dict[str, int] | None = None  # sentences held out (and in each part), sentences trained on
    teacher: dict[str, Any] | None = None  # the teacher check: model, scores, nothing_to_distil
    # The scored pairs selection read: the domain's, or the agreement pairs within the held-out selection part.
    selection_pairs: Path | None = None
    # The domain pairs the gate reads beside STS-B dev and SICK-R trial: the domain's (the same as selection's),
    # or the agreement pairs within the held-out gate part, which selection never read; None: no domain pairs.
    gate_pairs: Path | None = None

    def summary(self) -> dict[str, Any]:
        """What a retrain's result says of it: the selection, each run in short, the held-out share, the teacher,
        and which pairs selection and the gate read (``judged_on``)."""
        keys = ("objective", "init", "best_step", "steps", "beat_init", "selected_on")
        found = {"selected_on": self.selected_on, "runs": [{k: r.get(k) for k in keys} for r in self.runs]}
        found["judged_on"] = self.judged_on()
        return found | {
            k: v for k, v in (("heldout", self.heldout), ("teacher", self.teacher)) if v is not None
        }

    def judged_on(self) -> dict[str, Any]:
        """Which pairs selection and the gate read (the part of the data, the file, its pairs and sentences) and
        how many sentences both read (the same sentence by ``sentcl.data.roles.normalise``)."""
        label_free = self.selected_on == "teacher_agreement"
        gate_part = "heldout_gate" if label_free else "domain_dev"
        parts = {
            "selection": describe_pairs(
                "heldout_selection" if label_free else self.selected_on, self.selection_pairs
            ),
            "gate": describe_pairs(gate_part if self.gate_pairs else None, self.gate_pairs),
        }
        read = [set(parts[role].pop("keys")) for role in ("selection", "gate")]
        return parts | {"shared_sentences": len(read[0] & read[1])}

    @property
    def winner(self) -> dict[str, Any] | None:
        """The last run that beat its init: it holds the final weights (a later run that did not returned them)."""
        return next((r for r in reversed(self.runs) if r.get("beat_init")), None)


def run(plan: Plan, runner: Runner, say: Callable[[str], object] = print) -> Outcome:
    """Execute ``plan``, each stage by ``runner``; ``say`` gets the lines a person reads."""
    outcome = Outcome("trained", "domain_dev" if plan.domain_dev else "stsb_dev", [], plan.text)
    outcome.selection_pairs = outcome.gate_pairs = plan.domain_dev  # labelled: the gate reads the same pairs
    parts: list[str] = []
    if plan.hold_out:  # no labels: hold out a share before the teacher reads the text, in two parts
        counts = hold_out_file(plan.text, plan.training_text, plan.heldout_files, plan.agreement, plan.seed)
        held = counts["selection"] + counts["gate"]
        outcome.heldout = {"sentences": held, **counts}
        outcome.texts = plan.training_text
        parts = [part for part in PARTS if counts[part]]
        say(
            f"no --domain-dev: {held} of {counts['trained_on'] + held} sentences held out, never trained on: "
            f"{counts['selection']} to select on, {counts['gate']} for the gate (pairs within each part)"
        )
    agreement = None
    if plan.teacher:
        outcome.teacher = check_teacher(plan, runner, parts, say)
        if outcome.teacher.get("nothing_to_distil"):
            outcome.status = "teacher not better"
            return outcome
        # A part with fewer than 3 pairs has no Spearman: selection falls back to STS-B dev, and the gate
        # judges on STS-B dev and SICK-R trial only (said).
        usable = {p for p, f in (outcome.teacher.get("agreement") or {}).items() if f["pairs"] >= 3}
        if "selection" in usable:
            agreement = outcome.selection_pairs = plan.agreement_file("selection")
            outcome.selected_on = "teacher_agreement"
        if "gate" in usable:
            outcome.gate_pairs = plan.agreement_file("gate")
        elif plan.hold_out:
            say("too few held-out sentences for a gate part: the gate judges on STS-B dev and SICK-R trial")
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


def describe_pairs(part: str | None, path: Path | None) -> dict[str, Any]:
    """``part`` (what the pairs are), ``file``, ``pairs`` and ``sentences`` of a file of scored pairs (None
    without one: STS-B dev, or no domain pairs), with the sentences' ``keys`` (``normalise``) to compare."""
    if path is None:
        return {"part": part, "file": None, "pairs": None, "sentences": None, "keys": frozenset()}
    pairs = read_scored_pairs(path)
    keys = sentence_keys(s for a, b, _ in pairs for s in (a, b))
    return {"part": part, "file": str(path), "pairs": len(pairs), "sentences": len(keys), "keys": keys}


def check_teacher(
    plan: Plan, runner: Runner, parts: list[str], say: Callable[[str], object]
) -> dict[str, Any]:
    """The teacher stage (with the held-out ``parts``' agreement pairs), and teacher against student on the
    domain dev pairs: ``nothing_to_distil`` (the one line, said) when the teacher is not better by
    ``registry.min_delta``."""
    step = plan.teacher_step(parts)
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
    export stage's summary), and which pairs the gate and selection read (``judged_on``)."""
    gate = result.get("gate") or {}
    domain = f", domain {result['domain_spearman']:.2f}" if "domain_spearman" in result else ""
    lines = [
        f"retrain: candidate {result.get('checkpoint')} stsb_dev {result.get('stsb_dev', float('nan')):.2f}"
        f"{domain}, registered version {result.get('registered_version')}",
        f"retrain: gate {gate.get('decision', 'no verdict yet')}; champion is version {gate.get('champion_after')}",
    ]
    if "judged_on" in result:
        lines.append(f"retrain: {judged_on_line(result['judged_on'])}")
    return "\n".join(lines + [f"  - {r}" for r in gate.get("reasons", [])])


def judged_on_line(judged: dict[str, Any]) -> str:
    """One line: the domain pairs the gate judged on and those selection read, and the sentences both read."""

    def pairs(side: dict[str, Any]) -> str:
        if side["file"] is None:
            return "no domain pairs" if side["part"] is None else side["part"]
        return f"{side['pairs']:,} pairs among {side['sentences']:,} sentences of {side['part']} ({side['file']})"

    gate, selection = judged["gate"], judged["selection"]
    return (
        f"the gate judged on STS-B dev, SICK-R trial and {pairs(gate)}; selection read {pairs(selection)}; "
        f"sentences both read: {judged['shared_sentences']:,}"
    )
