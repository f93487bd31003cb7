"""Checkpoint selection, its one home: during training, whether an evaluation's weights replace the best
so far (``selectable``) and what a run reports of it (``TrainResult``); after the runs, which checkpoint
folder the export stage releases (``selection_score``, ``choose_checkpoint``, over metrics/sts.json's rows)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass
class TrainResult:
    init_score: float  # STS-B dev at step 0
    best_score: float  # STS-B dev of the selected step
    best_step: int  # 0: no evaluation beat the init, and the output is the init
    steps: int  # steps run
    seconds: float
    stopped_early: bool
    rows: list[dict[str, Any]]  # the curves: step, loss, lr, stsb_dev (and domain_dev)
    domain_init: float | None = None  # domain dev at step 0, when selection ran on a domain dev set
    domain_best: float | None = None  # domain dev of the selected step
    max_task_drop: float | None = None  # the STS-B guard of domain selection

    @property
    def beat_init(self) -> bool:
        return self.best_step > 0

    def metrics(self) -> dict[str, Any]:
        domain: dict[str, Any] = {"selected_on": "stsb_dev"}
        if self.domain_init is not None:
            domain = {
                "selected_on": "domain_dev",
                "domain_dev_step0": round(self.domain_init, 4),
                "domain_dev_best": round(self.domain_best, 4),
                "max_task_drop": self.max_task_drop,
            }
        return {
            "stsb_dev_step0": round(self.init_score, 4),
            "stsb_dev_best": round(self.best_score, 4),
            **domain,
            "best_step": self.best_step,
            "beat_init": self.beat_init,
            "steps": self.steps,
            "stopped_early": self.stopped_early,
            "seconds": round(self.seconds, 1),
        }


# --- during training: does an evaluation replace the best so far -----------------------------------


def selectable(
    scores: dict[str, float],
    best: dict[str, float],
    init: dict[str, float],
    min_delta: float,
    max_task_drop: float | None = None,
) -> bool:
    """Whether an evaluation's ``scores`` replace the ``best`` so far (scores: Spearman x 100 by name).

    Without ``domain_dev``: STS-B dev must beat the best by more than ``min_delta``. With it (a retrain for a
    domain): the domain dev score must beat the best's by more than ``min_delta``, and STS-B dev is a guard: a
    step whose STS-B dev is more than ``max_task_drop`` below the init's is never selected.
    """
    if "domain_dev" not in scores:
        return scores["stsb_dev"] > best["stsb_dev"] + min_delta
    if max_task_drop is None:
        raise ValueError("selection on a domain dev set needs max_task_drop, the STS-B dev guard")
    guarded = scores["stsb_dev"] >= init["stsb_dev"] - max_task_drop
    return guarded and scores["domain_dev"] > best["domain_dev"] + min_delta


# --- after the runs: which checkpoint folder the export releases --------------------------------------


def selection_score(row: Mapping[str, Any]) -> float:
    """STS-B dev; with a domain dev set, the mean of STS-B dev and the domain Spearman (both x 100), so a
    retrain that helps its domain can be the candidate even when general STS dips a little."""
    if row.get("domain_spearman") is not None:
        return (float(row["stsb_dev"]) + float(row["domain_spearman"])) / 2
    return float(row["stsb_dev"])


def choose_checkpoint(
    sts: Mapping[str, Any], available: set[str] | frozenset[str], max_dev_drop: float, reference: str = "base"
) -> str:
    """The checkpoint with the best selection score among ``available`` ones whose dev guards (SICK-R trial,
    ``sick_dev``) stay within ``max_dev_drop`` of the ``reference`` row's (the model every checkpoint started
    from): the gate's own dev guard, applied when choosing, so the export never picks a checkpoint the gate
    would refuse against its init. Without a reference row (or its ``sick_dev``) nothing is guarded. Ties keep
    file order. Only dev splits are read."""
    floor = None
    ref = sts.get(reference)
    if isinstance(ref, Mapping) and ref.get("sick_dev") is not None:
        floor = float(ref["sick_dev"]) - max_dev_drop

    def guarded(name: str, row: Mapping[str, Any]) -> bool:
        return (
            floor is None
            or name == reference
            or (row.get("sick_dev") is not None and row["sick_dev"] >= floor)
        )

    scored = [
        (selection_score(row), name)
        for name, row in sts.items()
        if isinstance(row, Mapping)
        and row.get("stsb_dev") is not None
        and name in available
        and guarded(name, row)
    ]
    if not scored:
        raise LookupError(f"no checkpoint with stsb_dev and a model folder among {sorted(sts)}")
    best = max(score for score, _ in scored)
    return next(name for score, name in scored if score == best)
