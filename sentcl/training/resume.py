"""Resume state: a run killed mid-way continues from its last save and ends where an uninterrupted run ends.

``state.pt`` in the run's checkpoint folder holds the encoder, the objective, the optimizer, the scheduler, the
momentum queue, every rank's random state and the loop's progress (``Trainer.fit``). It loads with
``weights_only=True`` (no pickled code) and is replaced atomically. Its fingerprint covers the config, the world
size, the training data and the init weights (and a retrain's selection data): a changed input never resumes old
weights.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from sentcl.training.objectives.contrastive import MomentumQueue
from sentcl.training.runtime import rng_state, set_rng_state

log = logging.getLogger(__name__)


def inputs_digest(examples: Sequence[Any], model: torch.nn.Module) -> str:
    """The training data and the init weights, as the fingerprint's digest of them."""
    digest = hashlib.sha256(json.dumps(examples, default=str).encode())
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def fingerprint(
    config: Any,
    world: int,
    inputs: str,
    domain_dev: Sequence[tuple[str, str, float]],
    max_task_drop: float | None,
) -> str:
    """Config, world size and ``inputs`` (``inputs_digest``): a changed input never resumes old weights."""
    values = asdict(config)
    values.pop("device")
    # Selection on another domain dev set (or another guard) restarts too.
    selection = [domain_dev, max_task_drop] if domain_dev else []
    payload = json.dumps([values, world, inputs, *selection], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


class ResumeState:
    """The resume state of one run in ``folder`` (None: no resume state).

    ``parts``: what is saved by ``state_dict`` and restored by ``load_state_dict`` under its name (the encoder's
    model, the objective, the optimizer, the scheduler); ``queue``: ESimCSE's momentum queue or None;
    ``generator``: the views' generator, saved with the rest of the random state of every rank.
    """

    def __init__(
        self,
        folder: Path | str | None,
        fingerprint: str,
        parts: dict[str, Any],
        queue: MomentumQueue | None,
        generator: torch.Generator,
        device: torch.device,
        rank: int = 0,
        world: int = 1,
    ) -> None:
        self.folder = Path(folder) if folder else None
        self.fingerprint, self.parts, self.queue, self.generator = fingerprint, parts, queue, generator
        self.device, self.rank, self.world = device, rank, world

    @property
    def path(self) -> Path | None:
        return self.folder / "state.pt" if self.folder else None

    def save(self, progress: dict[str, Any]) -> None:
        """Write ``progress`` (the loop's step, rows, scores, best weights) with everything that resumes it.
        Every rank calls it: each contributes its random state."""
        rngs = [rng_state(self.generator)]
        if self.world > 1:
            rngs = [None] * self.world
            torch.distributed.all_gather_object(rngs, rng_state(self.generator))
        if self.rank != 0 or self.path is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        payload = {
            **progress,
            "fingerprint": self.fingerprint,
            **{name: part.state_dict() for name, part in self.parts.items()},
            "momentum_model": self.queue.model.state_dict() if self.queue else None,
            "queue": self.queue.negatives.cpu() if self.queue else None,
            "rng": rngs,
        }
        tmp = self.path.with_suffix(".tmp")
        torch.save(payload, tmp)
        os.replace(tmp, self.path)  # a kill mid-write leaves the previous state intact

    def load(self) -> dict[str, Any] | None:
        """Restore a saved run of the same fingerprint and return its progress; None when there is none."""
        path = self.path
        if path is None or not path.is_file():
            return None
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # a torn or foreign file: say which folder to delete
            raise RuntimeError(
                f"{path}: unreadable resume state ({type(exc).__name__}); delete {self.folder} to start afresh"
            ) from None
        if payload.get("fingerprint") != self.fingerprint:
            log.warning("%s belongs to another config or data set: starting afresh", path)
            return None
        for name, part in self.parts.items():
            part.load_state_dict(payload[name])
        if self.queue is not None:
            self.queue.model.load_state_dict(payload["momentum_model"])
            self.queue.negatives = payload["queue"].to(self.device)
        set_rng_state(payload["rng"][self.rank], self.generator)
        return payload

    def remove(self) -> None:
        """Remove the resume state (rank 0), once the run's output is safely written."""
        if self.rank == 0 and self.folder and self.folder.exists():
            shutil.rmtree(self.folder)
