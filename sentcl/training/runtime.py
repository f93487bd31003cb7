"""What a run needs of its process and its random state: the rank and world size under ``torchrun``, the device,
which examples each step uses (``BatchOrder``), and the random state that resume and gradient caching replay."""

from __future__ import annotations

import os
import random
import resource
from typing import Any

import numpy as np
import torch


def cpu_seconds(own: bool = True) -> float:
    """User and system CPU seconds of this process's children that ended (encoding workers, a stage's process)
    and, with ``own``, of this process: what a piece of work cost across every core it used."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = children.ru_utime + children.ru_stime
    if own:
        mine = resource.getrusage(resource.RUSAGE_SELF)
        total += mine.ru_utime + mine.ru_stime
    return total


# --- distributed and device -----------------------------------------------------------------------------


def dist_info() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def select_device(name: str = "auto") -> torch.device:
    if name != "auto":
        return torch.device(name)
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


# --- data order -----------------------------------------------------------------------------------------


class BatchOrder:
    """Which examples step ``s`` uses: epochs of seeded permutations, cut into full batches.

    A pure function of (seed, step), so a resumed run needs no data-loader state beyond the step.
    """

    def __init__(self, n: int, batch_size: int, seed: int) -> None:
        if n == 0:
            raise ValueError("no training examples")
        self.n, self.batch_size, self.seed = n, min(batch_size, n), seed
        self.per_epoch = n // self.batch_size
        self._cache: dict[int, list[int]] = {}

    def indices(self, step: int) -> list[int]:
        epoch, k = divmod(step, self.per_epoch)
        if epoch not in self._cache:
            self._cache = {
                epoch: torch.randperm(
                    self.n, generator=torch.Generator().manual_seed(self.seed + epoch)
                ).tolist()
            }
        return self._cache[epoch][k * self.batch_size : (k + 1) * self.batch_size]


# --- random state ---------------------------------------------------------------------------------------


def rng_state(generator: torch.Generator) -> dict[str, Any]:
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": _numpy_state(),
        "views": generator.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _numpy_state() -> tuple:
    """NumPy's state with its key array as a tensor, so resume state loads with ``weights_only=True``."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss)


def set_rng_state(state: dict[str, Any], generator: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    generator.set_state(state["views"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
