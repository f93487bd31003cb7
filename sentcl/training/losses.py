"""Loss arithmetic: ConSERT's NT-Xent, SimCSE's InfoNCE, supervised SimCSE and the SBERT/ConSERT NLI classifier.

Each function is a transcription of its anchor's formula (named beside it); ``sentcl.training.objectives.factory`` decides which
embeddings go in. Similarities and losses are computed in fp32 whatever the autocast dtype of the encoder.

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


def _unit(x: torch.Tensor) -> torch.Tensor:
    return F.normalize(x.float(), p=2, dim=-1)


def nt_xent(
    z1: torch.Tensor,
    z2: torch.Tensor,
    temperature: float,
    extra_negatives: torch.Tensor | None = None,
) -> torch.Tensor:
    """ConSERT's NT-Xent, both directions summed (``AdvCLSoftmaxLoss._contrastive_loss_forward``)::

        loss_a = CE([z1 z2^T, z1 z1^T - 1e9 I] / t, i)      loss_b = CE([z2 z1^T, z2 z2^T - 1e9 I] / t, i)
        loss   = loss_a + loss_b

    with unit vectors (``do_hidden_normalization``). Each term is a mean over the N anchors, so the sum is twice
    the mean over all 2N anchors. ``extra_negatives`` (ESimCSE's momentum queue) join the candidates of the
    ``z1`` anchors only. Under ``torch.distributed`` N is the global batch.
    """
    a, b = _unit(z1), _unit(z2)
    ga, offset = gather_with_grad(a)
    gb, _ = gather_with_grad(b)
    labels = torch.arange(a.shape[0], device=a.device) + offset
    self_mask = F.one_hot(labels, ga.shape[0]).to(a.dtype) * 1e9
    logits_ab, logits_aa = a @ gb.T / temperature, a @ ga.T / temperature - self_mask
    logits_ba, logits_bb = b @ ga.T / temperature, b @ gb.T / temperature - self_mask
    anchors_a = [logits_ab, logits_aa]
    if extra_negatives is not None and extra_negatives.numel():
        anchors_a.append(a @ _unit(extra_negatives).T / temperature)
    loss_a = F.cross_entropy(torch.cat(anchors_a, dim=1), labels)
    loss_b = F.cross_entropy(torch.cat([logits_ba, logits_bb], dim=1), labels)
    return loss_a + loss_b


def info_nce(
    z1: torch.Tensor,
    z2: torch.Tensor,
    temperature: float,
    extra_negatives: torch.Tensor | None = None,
) -> torch.Tensor:
    """SimCSE's one-way InfoNCE (princeton-nlp/SimCSE ``simcse/models.py`` ``cl_forward``)::

        loss = CE(cos(z1_i, z2_j) / t, i)          (N - 1 in-batch negatives per anchor)

    ESimCSE (caskcsg/sentemb ``ESimCSE/esimcse/models.py``) appends ``cos(z1_i, queue_k) / t`` columns.
    """
    a, b = _unit(z1), _unit(z2)
    gb, offset = gather_with_grad(b)
    logits = [a @ gb.T / temperature]
    if extra_negatives is not None and extra_negatives.numel():
        logits.append(a @ _unit(extra_negatives).T / temperature)
    labels = torch.arange(a.shape[0], device=a.device) + offset
    return F.cross_entropy(torch.cat(logits, dim=1), labels)


def sup_simcse(
    anchor: torch.Tensor, positive: torch.Tensor, hard_negative: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Supervised SimCSE (``simcse/models.py`` ``cl_forward`` with ``num_sent == 3``, hard_negative_weight 0):
    each premise against all entailment hypotheses (its own is the positive) and all contradiction hypotheses."""
    a = _unit(anchor)
    gp, offset = gather_with_grad(_unit(positive))
    gn, _ = gather_with_grad(_unit(hard_negative))
    logits = a @ torch.cat([gp, gn]).T / temperature
    return F.cross_entropy(logits, torch.arange(a.shape[0], device=a.device) + offset)


class NLIHead(nn.Module):
    """SBERT's classifier over concat(u, v, |u - v|); ConSERT's ``--concatenation_sent_max_square`` adds
    ``max(u, v)^2`` (``AdvCLSoftmaxLoss._reps_to_output``)."""

    def __init__(self, dim: int, max_square: bool = False, num_labels: int = 3) -> None:
        super().__init__()
        self.max_square = max_square
        self.linear = nn.Linear((4 if max_square else 3) * dim, num_labels)

    def forward(self, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        features = [u, v, (u - v).abs()]
        if self.max_square:
            features.append(torch.max(u, v).pow(2))
        return self.linear(torch.cat(features, dim=-1))


def nli_loss(head: NLIHead, u: torch.Tensor, v: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the NLI classifier (mean over the pairs of this rank)."""
    return F.cross_entropy(head(u.float(), v.float()), labels)


class MLPProjection(nn.Module):
    """SimCSE's training-only pooler head (``simcse/models.py`` ``MLPLayer``: dense + tanh); not saved with the
    model, so evaluation sees the encoder's own pooling (``--mlp_only_train``)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dense = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(x))
