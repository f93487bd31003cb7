"""Training objectives: NT-Xent, the NLI classifier, the joint loss and supervised SimCSE.

Under ``torch.distributed`` the contrastive losses all-gather the embeddings of every rank with gradient
(``torch.distributed.nn.functional.all_gather``), so the negatives of each anchor span the global batch.
Each rank scores its own anchors against all candidates; averaging the gradients across ranks (what DDP does)
then gives exactly the gradient of the loss over the global batch.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

NLI_LABEL_IDS = {"entailment": 0, "neutral": 1, "contradiction": 2}


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def gather_with_grad(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """All ranks' ``x`` concatenated along dim 0 (gradient flows back to every rank) and this rank's offset."""
    if not _distributed() or torch.distributed.get_world_size() == 1:
        return x, 0
    from torch.distributed.nn.functional import all_gather

    # Deprecated in favour of a private (underscore) module; the public autograd-aware gather still works.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        parts = all_gather(x.contiguous())
    return torch.cat(parts), torch.distributed.get_rank() * x.shape[0]


def nt_xent(
    z1: torch.Tensor,
    z2: torch.Tensor,
    temperature: float,
    extra_negatives: torch.Tensor | None = None,
) -> torch.Tensor:
    """NT-Xent over the 2N views of a batch, with cosine similarity.

    For the anchor ``z1[i]`` the positive is ``z2[i]`` (and vice versa); the other 2N-2 views are negatives,
    plus ``extra_negatives`` (e.g. a momentum queue) when given. The loss is the mean over all 2N anchors.
    Under ``torch.distributed`` N is the global batch.
    """
    local = z1.shape[0]
    g1, offset = gather_with_grad(z1)
    g2, _ = gather_with_grad(z2)
    n = g1.shape[0]
    candidates = F.normalize(torch.cat([g1, g2]).float(), dim=-1)
    anchors = F.normalize(torch.cat([z1, z2]).float(), dim=-1)  # this rank's 2 * local anchors
    logits = anchors @ candidates.T / temperature
    rows = torch.arange(local, device=z1.device) + offset
    self_index = torch.cat([rows, rows + n])
    positive = torch.cat([rows + n, rows])
    logits[torch.arange(2 * local, device=z1.device), self_index] = float("-inf")
    if extra_negatives is not None and extra_negatives.numel():
        extra = anchors @ F.normalize(extra_negatives.float(), dim=-1).T / temperature
        logits = torch.cat([logits, extra], dim=1)
    return F.cross_entropy(logits, positive)


def sup_simcse(
    anchor: torch.Tensor, positive: torch.Tensor, hard_negative: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Supervised SimCSE: each premise against all entailment hypotheses (its own is the positive) and all
    contradiction hypotheses (its own is a hard negative), cosine similarity, mean over anchors."""
    local = anchor.shape[0]
    gp, offset = gather_with_grad(positive)
    gn, _ = gather_with_grad(hard_negative)
    a = F.normalize(anchor.float(), dim=-1)
    candidates = F.normalize(torch.cat([gp, gn]).float(), dim=-1)
    logits = a @ candidates.T / temperature
    return F.cross_entropy(logits, torch.arange(local, device=anchor.device) + offset)


class NLIHead(nn.Module):
    """SBERT's classifier: a linear layer over concat(u, v, |u - v|) into the three NLI labels."""

    def __init__(self, dim: int, num_labels: int = 3) -> None:
        super().__init__()
        self.linear = nn.Linear(3 * dim, num_labels)

    def forward(self, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.cat([u, v, (u - v).abs()], dim=-1))


def nli_loss(head: NLIHead, u: torch.Tensor, v: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the NLI classifier (mean over the pairs of this rank)."""
    return F.cross_entropy(head(u.float(), v.float()), labels)


def joint_loss(
    head: NLIHead,
    u: torch.Tensor,
    v: torch.Tensor,
    labels: torch.Tensor,
    z1: torch.Tensor,
    z2: torch.Tensor,
    temperature: float,
    alpha: float = 0.15,
) -> torch.Tensor:
    """ConSERT's joint objective: CE + alpha * NT-Xent, the contrastive part over two views of the NLI sentences."""
    return nli_loss(head, u, v, labels) + alpha * nt_xent(z1, z2, temperature)
