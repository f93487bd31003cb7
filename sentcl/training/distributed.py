"""Data parallelism under ``torchrun``, done by hand: what each rank trains on and what the ranks exchange.

The global ``batch_size`` is split over the ranks (``rank_share``); contrastive losses all-gather the embeddings
(``sentcl.training.losses``), and gradients are averaged with one all-reduce per step (``all_reduce_gradients``):
what DDP does, done by hand because the cached-gradient passes (``sentcl.training.gradcache``) and unused
parameters such as BERT's pooler do not fit DDP's hooks. The rank and world size are
``sentcl.training.runtime.dist_info``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from sentcl.training.runtime import dist_info


def rank_share(indices: Sequence[int], rank: int, world: int) -> list[int]:
    """This rank's contiguous share of a global batch's example indices."""
    share = len(indices) // world
    return list(indices[rank * share : (rank + 1) * share])


def mean_over_ranks(loss: torch.Tensor, world: int) -> float:
    """The loss of the global batch: the mean of the ranks' losses."""
    value = loss.detach().float()
    if world > 1:
        torch.distributed.all_reduce(value)
        value /= world
    return float(value)


def all_reduce_gradients(params: Sequence[torch.nn.Parameter], world: int) -> None:
    """Average every parameter's gradient over the ranks in one flat all-reduce; a parameter without a gradient on
    a rank counts as zero there."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.flatten() for g in grads])
    torch.distributed.all_reduce(flat)
    flat /= world
    offset = 0
    for p, g in zip(params, grads, strict=True):
        p.grad = flat[offset : offset + g.numel()].view_as(p).clone()
        offset += g.numel()


def broadcast(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (a picklable object)."""
    rank, world = dist_info()
    if world == 1:
        return value
    box = [value if rank == 0 else None]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]
