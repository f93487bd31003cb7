"""The loss of a training step: an objective's loss on a batch (``ObjectiveLoss``), or GradCache's wrapper of it
(``CachedLoss``), as sentence-transformers' ``CachedMultipleNegativesRankingLoss`` wraps
``MultipleNegativesRankingLoss`` (``sentence_transformers/base/losses/gradcache.py``, ``CachedLossMixin``).

Gradient accumulation (``train.grad_accum`` > 1) never shrinks the set of negatives. GradCache (Gao et al. 2021,
"Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup") splits a step's batch into micro-batches:

1. it embeds every micro-batch without gradient, keeping the random state each one starts from;
2. it computes the objective's loss over the whole batch from those embeddings and back-propagates it, which caches
   the embeddings' gradient (and gives the objective's own parameters, a projection or a classifier, theirs);
3. ``loss.backward()`` on the loss it returns re-embeds each micro-batch with gradient from its saved random state
   (the same views and dropout masks) and feeds it its slice of the cached gradient (a hook on the loss).

Unlike sentence-transformers' hook, which multiplies the cached gradients by the gradient the loss receives, a
scaled backward (``(2 * loss).backward()``) is refused: the objective's parameters took theirs unscaled in step 2.

The update equals the one of a single large batch; the price is one extra forward pass per micro-batch. Activation
memory is that of one micro-batch; the similarity matrix is still batch x batch. The random state replayed is
torch's, Python's, NumPy's and the views' generator (``sentcl.training.runtime``), and after the replay it is
where the first pass left it.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import torch

from sentcl.training.objectives.base import Embedder, Objective, Reps
from sentcl.training.runtime import rng_state, set_rng_state


class ObjectiveLoss:
    """``objective``'s loss on a batch of examples: its representations (run by ``embed``), then its loss."""

    def __init__(self, objective: Objective, embed: Embedder) -> None:
        self.objective, self.embed = objective, embed

    def representations(self, items: Sequence[Any]) -> Reps:
        return self.objective.representations(self.embed, items)

    def __call__(self, items: Sequence[Any], negatives: torch.Tensor | None = None) -> torch.Tensor:
        return self.objective.loss(self.representations(items), negatives)


class CachedLoss:
    """GradCache around ``loss``: called as the loss it wraps, over ``micro_batches`` interleaved micro-batches
    (``items[i::micro_batches]``); the encoder's gradients arrive when the returned loss is back-propagated."""

    def __init__(self, loss: ObjectiveLoss, micro_batches: int) -> None:
        self.loss, self.micro_batches = loss, micro_batches

    def __call__(self, items: Sequence[Any], negatives: torch.Tensor | None = None) -> torch.Tensor:
        micro = [items[i :: self.micro_batches] for i in range(self.micro_batches)]
        generator = self.loss.embed.generator
        states, cached = [], []
        with torch.no_grad():
            for part in micro:
                states.append(rng_state(generator))
                cached.append(self.loss.representations(part))
        end_state = rng_state(generator)
        leaves = {
            key: torch.cat([c[key].detach() for c in cached]).requires_grad_(
                cached[0][key].is_floating_point()
            )
            for key in cached[0]
        }
        loss = self.loss.objective.loss(leaves, negatives)
        loss.backward()
        loss = loss.detach().requires_grad_()
        loss.register_hook(partial(self._replay, micro, states, end_state, leaves))
        return loss

    def _replay(
        self,
        micro: list[Sequence[Any]],
        states: list[dict[str, Any]],
        end_state: dict[str, Any],
        leaves: Reps,
        grad_output: torch.Tensor,
    ) -> None:
        """Each micro-batch again, with gradient, from its random state, given its slice of the cached gradient."""
        if bool(grad_output != 1):
            raise RuntimeError(
                f"a cached loss back-propagates as it is (loss.backward()), got a gradient of {float(grad_output)}: "
                "the objective's own parameters took their gradient unscaled when the loss was computed"
            )
        generator = self.loss.embed.generator
        offset = 0
        with torch.enable_grad():
            for part, state in zip(micro, states, strict=True):
                set_rng_state(state, generator)
                reps = self.loss.representations(part)
                size = len(part)
                pairs = [
                    (reps[k], leaves[k].grad[offset * m : (offset + size) * m])
                    for k, m in _rows_per_item(reps, size).items()
                    if leaves[k].grad is not None
                ]
                torch.autograd.backward([r for r, _ in pairs], [g for _, g in pairs])
                offset += size
        set_rng_state(end_state, generator)


def _rows_per_item(reps: Reps, size: int) -> dict[str, int]:
    return {k: v.shape[0] // size for k, v in reps.items() if v.is_floating_point()}
