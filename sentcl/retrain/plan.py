"""What a retrain will do, decided before anything runs: its runs (one transfer per objective of the method, each
from the previous one's output), the selection data (the domain's scored dev pairs; without them, for a method
that distils, the teacher's agreement pairs among the selection part of a held-out share of the text, the gate
judging on the other part; else STS-B dev) and the teacher check (with dev pairs, the teacher must beat the
student on them by ``registry.min_delta``).

Every stage of the plan is a command line built by ``Params.command`` from the retrain's params: the process's
params.yaml and overrides with ``retrain.transfer`` over ``transfer:``. Files go under ``work``: ``texts.txt``
(what trains, when a share is held out), ``heldout-selection.txt`` and ``heldout-gate.txt`` (the held-out share's
two parts), ``teacher/`` (with ``agreement-selection.tsv`` and ``agreement-gate.tsv``), ``models/<stage>``,
``metrics/``, ``checkpoints/``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sentcl.params import Params
from sentcl.registry.rules import GateConfig
from sentcl.retrain.agreement import AGREEMENT_FILES, PARTS, AgreementConfig
from sentcl.retrain.config import RetrainConfig


@dataclass(frozen=True)
class Step:
    """One stage of a retrain: its name, its command line and the JSON record it leaves."""

    name: str
    command: list[str]
    record: Path
    output: Path


@dataclass(frozen=True)
class Plan:
    params: Params  # what every stage reads: the process's params with retrain.transfer over transfer
    method: str
    objectives: tuple[str, ...]
    teacher: str | None  # the teacher a distill method learns from
    init: str  # the model the first run starts from (a folder)
    text: Path  # the domain text, one sentence a line, deduplicated
    work: Path
    name: str  # stage names: <name>-<objective>, <name>-<objective>-<objective> for a second run
    domain_dev: Path | None  # scored pairs of the domain: selection, with STS-B dev a guard
    agreement: AgreementConfig
    seed: int
    min_delta: float  # registry.min_delta: how much better than the student the teacher must score
    processed: (
        Path | None
    )  # a folder with the validate stage's pairs.parquet (STS-B dev); None: the stages' own
    steps: Mapping[str, int | None] = field(default_factory=dict)  # by objective: a smoke run's steps
    options: Mapping[str, Any] = field(default_factory=dict)  # more transfer flags (--recipe, --max-texts)
    init_label: str = "the init"  # what the init is, in a sentence (base, champion version 3)

    @property
    def hold_out(self) -> bool:
        """No scored pairs and a teacher: a share of the text is held out, one part to select on, one to gate on."""
        return self.teacher is not None and self.domain_dev is None

    @property
    def selection(self) -> str:
        """What selects the checkpoints, as planned (``teacher_agreement`` falls back to ``stsb_dev`` when the
        text is too short to hold anything out)."""
        if self.domain_dev:
            return "domain_dev"
        return "teacher_agreement" if self.hold_out else "stsb_dev"

    @property
    def training_text(self) -> Path:
        return self.work / "texts.txt" if self.hold_out else self.text

    @property
    def heldout_files(self) -> dict[str, Path]:
        """The held-out sentences' two parts, by who reads their pairs: ``selection`` and ``gate``."""
        return {part: self.work / f"heldout-{part}.txt" for part in PARTS}

    def teacher_step(self, parts: Sequence[str] = ()) -> Step:
        """The teacher stage on the training text into ``work/teacher``: with dev pairs, teacher and student
        (the init) scored on them; with held-out ``parts``, the agreement pairs within each part."""
        output = self.work / "teacher"
        flags = {"--model": self.teacher, "--texts": self.training_text, "--output": output}
        flags |= {"--processed": self.processed, "--domain-dev": self.domain_dev}
        flags |= {"--student": self.init if self.domain_dev else None}
        flags |= {
            "--heldout": self.heldout_files["selection"] if "selection" in parts else None,
            "--heldout-gate": self.heldout_files["gate"] if "gate" in parts else None,
        }
        return Step("teacher", self.params.command("stages.teacher", flags), output / "teacher.json", output)

    def agreement_file(self, part: str = "selection") -> Path:
        """The teacher's agreement pairs within the held-out ``part`` (``selection`` or ``gate``)."""
        return self.work / "teacher" / AGREEMENT_FILES[part]

    def transfer_step(self, index: int, init: str, agreement: Path | None) -> Step:
        """The ``index``-th run (its objective) from ``init``, selecting on the dev pairs or ``agreement``."""
        objective = self.objectives[index]
        # Named by its chain: <name>-tsdae, then <name>-tsdae-contrastive.
        stage = "-".join((self.name, *self.objectives[: index + 1]))
        output = self.work / "models" / stage
        flags = {"--init": init, "--texts": self.training_text, "--output": output, "--stage": stage}
        flags |= {"--objective": objective, "--metrics-dir": self.work / "metrics"}
        flags |= {"--checkpoints-dir": self.work / "checkpoints", "--processed": self.processed}
        flags |= {
            "--steps": self.steps.get(objective),
            "--domain-dev": self.domain_dev,
            "--agreement": agreement,
        }
        flags |= {
            "--teacher-vectors": self.work / "teacher" if objective == "distill" else None,
            **self.options,
        }
        record = self.work / "metrics" / "train" / f"{stage}.json"
        return Step(stage, self.params.command("stages.transfer", flags), record, output)

    def evaluate_step(self, models: Mapping[str, str], raw: Path) -> Step:
        """The evaluate stage on ``models`` (name -> folder) into ``work/sts.json``."""
        output = self.work / "sts.json"
        flags = {"--output": output, "--no-progress": True, "--data": raw}
        flags |= {"--model": [f"{name}={folder}" for name, folder in models.items()]}
        return Step("evaluate", self.params.command("stages.evaluate", flags), output, output)

    def export_step(self, models: Mapping[str, str], raw: Path, dev: Path | None) -> Step:
        """The export stage: the better of ``models`` (scored in ``work/candidates.json``, each also on ``dev``
        when given) as the release folder ``work/export``; static int8 calibrates on what the runs trained on."""
        output = self.work / "export.json"
        flags = {
            "--sts": self.work / "candidates.json",
            "--output": self.work / "export",
            "--summary": output,
        }
        flags |= {"--model": [f"{name}={folder}" for name, folder in models.items()]}
        flags |= {"--train-metrics": self.work / "metrics" / "train", "--data": raw}
        flags |= {"--calibration-text": self.training_text, "--domain-dev": dev}
        return Step("export", self.params.command("stages.export", flags), output, self.work / "export")

    def register_step(self, tags: Mapping[str, str], dev: Path | None) -> Step:
        """The register stage: ``work/export`` registered and the gate run on STS-B dev, SICK-R trial and ``dev``
        (the gate's domain pairs: the domain dev pairs, or the agreement pairs of the held-out gate part, which
        selection never read), the run and the version tagged with ``tags``."""
        output = self.work / "registry.json"
        flags = {"--release": self.work / "export", "--summary": output, "--processed": self.processed}
        flags |= {"--domain-dev": dev, "--tag": [f"{key}={value}" for key, value in tags.items()]}
        return Step("register", self.params.command("stages.register", flags), output, output)


def plan(
    config: RetrainConfig,
    params: Params,
    text: Path,
    init: str,
    work: Path,
    name: str,
    processed: Path | None = None,
    domain_dev: Path | None = None,
    steps: Mapping[str, int | None] | None = None,
    init_label: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> Plan:
    """The retrain of ``text`` from ``init`` that ``config`` asks for; ``domain_dev`` scored pairs of the domain
    (none: selection without labels), ``steps`` a smoke run's steps by objective, ``init_label`` the init in a
    sentence, ``options`` more flags for every transfer."""
    return Plan(
        params.overlaid(config.overrides),
        config.method,
        config.objectives,
        config.teacher,
        init,
        text,
        work,
        name,
        domain_dev,
        config.agreement,
        int(params["seed"]),
        GateConfig.from_params(params).min_delta,
        processed,
        dict(steps or {}),
        dict(options or {}),
        init_label or init,
    )


def teacher_not_better(
    teacher: str, teacher_score: float, student_score: float, min_delta: float
) -> str | None:
    """Why distilling would teach nothing (one line), or None: the teacher must beat the student on the
    domain's dev pairs by more than ``min_delta`` (params ``registry.min_delta``: the registry's margin for a
    score that counts as better; a smaller lead is noise, and a student rarely overtakes its teacher)."""
    if teacher_score - student_score > min_delta:
        return None
    return (
        f"teacher {teacher} scores {teacher_score:.2f} on the domain dev pairs, the student {student_score:.2f}: "
        f"not better by more than registry.min_delta {min_delta:.2f}, nothing to distil"
    )
