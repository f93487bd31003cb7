"""Contrastive and NLI objectives: two views of a sentence (ConSERT, SimCSE, ESimCSE), the NLI classifier
(SBERT/ConSERT), supervised SimCSE, ConSERT's joint objective, and ESimCSE's momentum queue of negatives."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from sentcl.training.losses import NLIHead, nli_loss, sup_simcse
from sentcl.training.objectives.base import CONTRASTIVE_LOSSES, Embedder, Objective, Reps


class Contrastive(Objective):
    """Unsupervised contrastive training on sentences: two views of each, pulled together (ConSERT unsup, SimCSE,
    ESimCSE). ConSERT multiplies its contrastive loss by ``--cl_rate`` even with ``--cl_loss_only`` (``alpha``)."""

    def __init__(
        self,
        loss: str,
        temperature: float,
        views: tuple[str, str],
        alpha: float,
        projection: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.contrastive, self.temperature, self.views, self.alpha = (
            CONTRASTIVE_LOSSES[loss],
            temperature,
            views,
            alpha,
        )
        self.projection = projection

    def project(self, z: torch.Tensor) -> torch.Tensor:
        return self.projection(z.float()) if self.projection is not None else z

    def pair_loss(
        self, z1: torch.Tensor, z2: torch.Tensor, negatives: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.contrastive(self.project(z1), self.project(z2), self.temperature, negatives)

    def representations(self, embed: Embedder, items: Sequence[str]) -> Reps:
        batch = embed.tokenize(items)
        return {"z1": embed(batch, self.views[0]), "z2": embed(batch, self.views[1])}

    def loss(self, reps: Reps, negatives: torch.Tensor | None = None) -> torch.Tensor:
        return self.alpha * self.pair_loss(reps["z1"], reps["z2"], negatives)

    @torch.no_grad()
    def queue_entries(self, z: torch.Tensor) -> torch.Tensor:
        """Through the same MLP head as the anchors (ESimCSE ``models.py`` ``cl_forward``: the momentum encoder's
        ``pooler_output`` goes through ``cls.mlp`` before ``.detach()``), so the queue is in the anchors' space."""
        return self.project(z).detach()


class NLIClassifier(Objective):
    """SBERT / ConSERT supervised NLI: the classifier's cross-entropy (``AdvCLSoftmaxLoss`` without contrast)."""

    examples = "pairs"
    head_parameters = ("head",)

    def __init__(self, dim: int, max_square: bool) -> None:
        super().__init__()
        self.head = NLIHead(dim, max_square)

    def representations(self, embed: Embedder, items: Sequence[Any]) -> Reps:
        premises, hypotheses, labels = zip(*items, strict=True)
        # Premises and hypotheses go through the model together: one forward for u and v.
        u, v = embed(embed.tokenize(list(premises) + list(hypotheses))).chunk(2)
        return {"u": u, "v": v, "labels": torch.tensor(labels, device=u.device)}

    def loss(self, reps: Reps, negatives: torch.Tensor | None = None) -> torch.Tensor:
        return nli_loss(self.head, reps["u"], reps["v"], reps["labels"])


class SupSimCSE(Objective):
    """Supervised SimCSE on (premise, entailment, contradiction) triplets."""

    examples = "triplets"

    def __init__(self, temperature: float) -> None:
        super().__init__()
        self.temperature = temperature

    def representations(self, embed: Embedder, items: Sequence[Any]) -> Reps:
        a, p, n = zip(*items, strict=True)
        anchor, positive, negative = embed(embed.tokenize(list(a) + list(p) + list(n))).chunk(3)
        return {"anchor": anchor, "positive": positive, "negative": negative}

    def loss(self, reps: Reps, negatives: torch.Tensor | None = None) -> torch.Tensor:
        return sup_simcse(reps["anchor"], reps["positive"], reps["negative"], self.temperature)


class Joint(Objective):
    """ConSERT's joint objective (``AdvCLSoftmaxLoss.forward`` with ``--add_cl``)::

        loss = CE(u, v) + alpha * (C(premises view 1, view 2) + C(hypotheses view 1, view 2))

    The classifier reads the first view's pass; premises and hypotheses are contrasted separately, so a premise's
    own hypothesis is never one of its negatives. With ``views[1] == "adversarial"`` the second view's embedding
    output is the first pass's plus ``eps * g / ||g||`` (per token), g the gradient of the CE loss at the first
    pass's embedding output; the sum keeps the first pass's graph, as ConSERT's ``noise_embedding`` does.
    """

    examples = "pairs"
    head_parameters = ("classifier",)

    def __init__(self, dim: int, max_square: bool, contrastive: Contrastive) -> None:
        super().__init__()
        self.classifier = NLIClassifier(dim, max_square)
        self.contrastive = contrastive

    def representations(self, embed: Embedder, items: Sequence[Any]) -> Reps:
        premises, hypotheses, labels = zip(*items, strict=True)
        first, second = self.contrastive.views
        batch = embed.tokenize(list(premises) + list(hypotheses))
        labels = torch.tensor(labels, device=embed.device)
        grad = base = None
        if second == "adversarial":
            captured: list[torch.Tensor] = []
            with torch.enable_grad():  # also inside gradient caching's no-grad pass
                u, v = embed(batch, first, capture=captured).chunk(2)
                ce = nli_loss(self.classifier.head, u, v, labels)
                (grad,) = torch.autograd.grad(ce, captured[0], retain_graph=True)
            base = captured[0]
        else:
            u, v = embed(batch, first).chunk(2)
        p2, h2 = embed(batch, second, adversarial_grad=grad, adversarial_base=base).chunk(2)
        return {"u": u, "v": v, "labels": labels, "p2": p2, "h2": h2}

    def queue_entries(self, z: torch.Tensor) -> torch.Tensor:
        return self.contrastive.queue_entries(z)

    def loss(self, reps: Reps, negatives: torch.Tensor | None = None) -> torch.Tensor:
        ce = self.classifier.loss(reps)
        c = self.contrastive
        premises = c.pair_loss(reps["u"], reps["p2"], negatives)
        hypotheses = c.pair_loss(reps["v"], reps["h2"], negatives)
        return ce + c.alpha * (premises + hypotheses)


class MomentumQueue:
    """ESimCSE's queue of extra negatives (``ESimCSE/esimcse/trainers.py`` ``compute_loss``, ``models.py``).

    Before each step the momentum encoder moves toward the encoder (``m = m * momentum + p * (1 - momentum)``)
    and embeds the batch's sentences in eval mode (no dropout); the loss uses the queue as it was, then the new
    embeddings join it and the oldest beyond ``size`` leave. The trainer passes the new embeddings through the
    objective's ``queue_entries`` (the MLP head when ``projection`` is on) before they are pushed.
    """

    def __init__(self, model: nn.Module, size: int, momentum: float) -> None:
        self.model = copy.deepcopy(model).requires_grad_(False).eval()
        self.size, self.momentum = size, momentum
        self.negatives = torch.zeros(0, model.config.hidden_size, device=next(model.parameters()).device)

    @torch.no_grad()
    def advance(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Move the momentum encoder and embed ``batch`` with it (the entries to push after this step)."""
        for m, p in zip(self.model.parameters(), model.parameters(), strict=True):
            m.mul_(self.momentum).add_(p.detach(), alpha=1 - self.momentum)
        self.model.eval()
        out = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        mask = batch["attention_mask"].unsqueeze(-1).to(out.last_hidden_state.dtype)
        return ((out.last_hidden_state * mask).sum(1) / mask.sum(1).clamp(min=1e-9)).float()

    def push(self, z: torch.Tensor) -> None:
        self.negatives = torch.cat([self.negatives, z])[-self.size :]
