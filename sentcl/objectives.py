"""Training objectives as small pieces: what examples each reads, which embeddings it needs, and its loss.

An objective turns a micro-batch of examples into the embeddings its loss needs (``representations``) and turns
those into a loss (``loss``). The split is what gradient caching needs: ``Trainer`` embeds every micro-batch
first, computes the loss over the whole batch, then replays each micro-batch with gradient.

=================  ===========================  =====================================================
objective          examples                     loss
=================  ===========================  =====================================================
``Contrastive``    sentences                    alpha * NT-Xent or InfoNCE over views[0], views[1]
``NLIClassifier``  (premise, hypothesis, label) CE of the classifier over concat(u, v, |u-v|[, max^2])
``SupSimCSE``      (premise, entailed, contra.) supervised SimCSE
``Joint``          (premise, hypothesis, label) CE on views[0] + alpha * (C(premises) + C(hypotheses))
=================  ===========================  =====================================================
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from sentcl.encoder import Encoder
from sentcl.losses import MLPProjection, NLIHead, info_nce, nli_loss, nt_xent, sup_simcse
from sentcl.views import ViewConfig, embedding_output_hook, make_view, position_offset

CONTRASTIVE_LOSSES: dict[str, Callable[..., torch.Tensor]] = {"nt_xent": nt_xent, "info_nce": info_nce}
Reps = dict[str, torch.Tensor]


class Embedder:
    """Runs the encoder on one view of a tokenized batch: the view's inputs, its embedding-output hook, autocast.

    Training pools with last-avg; the encoder's own dropout is whatever train/eval mode the trainer set.
    """

    def __init__(
        self,
        encoder: Encoder,
        view_config: ViewConfig,
        generator: torch.Generator,
        device: torch.device,
        autocast_dtype: torch.dtype | None = None,
    ) -> None:
        self.encoder, self.view_config, self.generator, self.device = encoder, view_config, generator, device
        self.autocast_dtype = autocast_dtype
        self.pad_id = encoder.tokenizer.pad_token_id or 0
        self.position_start = position_offset(encoder.model)

    def tokenize(self, sentences: Sequence[str]) -> dict[str, torch.Tensor]:
        return self.encoder.tokenize(sentences).to(self.device)

    def __call__(
        self,
        batch: dict[str, torch.Tensor],
        view: str = "none",
        adversarial_grad: torch.Tensor | None = None,
        capture: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Sentence vectors of ``view`` of ``batch``; ``capture`` receives the (perturbed) embedding output."""
        inputs = make_view(
            view,
            batch["input_ids"],
            batch["attention_mask"],
            self.view_config,
            self.generator,
            hidden=self.encoder.dim,
            pad_id=self.pad_id,
            position_start=self.position_start,
            adversarial_grad=adversarial_grad,
        )
        perturb = inputs.embedding_output
        hook = perturb
        if capture is not None:

            def hook(output: torch.Tensor) -> torch.Tensor:
                output = perturb(output) if perturb else output
                capture.append(output)
                return output

        kwargs = {} if inputs.position_ids is None else {"position_ids": inputs.position_ids}
        enabled = self.autocast_dtype is not None
        with (
            embedding_output_hook(self.encoder.model, hook),
            torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.bfloat16, enabled=enabled),
        ):
            return self.encoder(inputs.input_ids, inputs.attention_mask, "last-avg", **kwargs)


class Objective(nn.Module):
    """Base class; the parameters an objective owns (a classifier, a projection) train with the encoder."""

    examples = "sentences"  # sentences | pairs | triplets
    head_parameters: tuple[str, ...] = ()  # submodules trained at head_lr

    def representations(self, embed: Embedder, items: Sequence[Any]) -> Reps:
        raise NotImplementedError

    def loss(self, reps: Reps, negatives: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError


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
    own hypothesis is never one of its negatives. With ``views[1] == "adversarial"`` the second view adds
    ``eps * g / ||g||`` to the first pass's embedding output, g the gradient of the CE loss there.
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
        grad = None
        if second == "adversarial":
            captured: list[torch.Tensor] = []
            with torch.enable_grad():  # also inside gradient caching's no-grad pass
                u, v = embed(batch, first, capture=captured).chunk(2)
                ce = nli_loss(self.classifier.head, u, v, labels)
                (grad,) = torch.autograd.grad(ce, captured[0], retain_graph=True)
        else:
            u, v = embed(batch, first).chunk(2)
        p2, h2 = embed(batch, second, adversarial_grad=grad).chunk(2)
        return {"u": u, "v": v, "labels": labels, "p2": p2, "h2": h2}

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
    embeddings join it and the oldest beyond ``size`` leave.
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


def build_objective(config: Any, dim: int) -> Objective:
    """The objective of a ``TrainConfig``: the one place that reads ``mode`` and ``objective``."""
    contrastive = Contrastive(
        config.loss,
        config.temperature,
        config.views,
        config.alpha,
        MLPProjection(dim) if config.projection else None,
    )
    if config.mode == "transfer":
        return contrastive
    if config.mode == "joint":
        return Joint(dim, config.max_square, contrastive)
    if config.objective == "sup_simcse":
        return SupSimCSE(config.temperature)
    return NLIClassifier(dim, config.max_square)
