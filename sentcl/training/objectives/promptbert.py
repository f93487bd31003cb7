"""PromptBERT's training pieces (Jiang et al., 2022): its settings, its unsupervised contrastive loss and its
objective for the trainer. The pooling they train (the [MASK] state of a template, template denoising) is
:mod:`sentcl.model.prompt`, which evaluation and serving use too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from sentcl.model.pooling import PromptSettings, check_template
from sentcl.model.prompt import PromptPooler, denoise_batch, prompt_states
from sentcl.training.losses import MLPProjection, info_nce, sup_simcse
from sentcl.training.objectives.chunks import run_in_chunks


@dataclass
class PromptTraining:
    """PromptBERT's training settings (params.yaml ``train.prompt``; a stage's ``prompt:`` merges key by key), read
    when ``objective`` is ``promptbert``:

    - ``templates``: two for unsupervised training (the two views of a sentence), one for supervised NLI (anchor,
      positive and hard negative all under it);
    - ``denoise``: subtract each template's own delta in training (run.sh ``--mask_embedding_sentence_delta``);
    - ``saved``: the pooling the trained folder is saved with (``sentcl_pooling.json``) and STS-B dev is scored
      with during training, so the checkpoint is selected with the pooling it ships with.
    """

    templates: tuple[str, ...]
    denoise: bool
    saved: PromptSettings

    def __post_init__(self) -> None:
        if isinstance(self.templates, str) or not isinstance(self.templates, Sequence):
            raise ValueError(f"prompt.templates: a list of templates, got {self.templates!r}")
        self.templates = tuple(self.templates)
        for template in self.templates:
            try:
                check_template(template)
            except ValueError as exc:
                raise ValueError(f"prompt.templates: {exc}") from None
        if isinstance(self.saved, dict):
            try:
                self.saved = PromptSettings(**self.saved)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"prompt.saved: {exc}") from None


# models.py ``MLPLayer`` (dense + tanh), training only (run.sh unsup-bert ``--mlp_only_train``): SimCSE's head.
MLPHead = MLPProjection


class PromptContrastiveLoss(nn.Module):
    """PromptBERT's unsupervised objective: the two views of a sentence are the sentence under two templates,
    each denoised by its own template's delta (models.py ``cl_forward``: ``delta``/``delta1``, ``blen`` per
    template), then the training-only MLP head, then SimCSE's InfoNCE (sentcl.training.losses.info_nce, the same arithmetic
    as models.py ``cos_sim = cls.sim(z1, z2)``; ``CrossEntropyLoss(cos_sim, arange)``) at ``temperature`` (0.05).

    ``loss(model, tokenizer, sentences)``; ``views`` gives (z1, z2) before the loss for trainers that gather
    representations themselves (GradCache, all-gather)."""

    def __init__(
        self,
        tokenizer,
        templates: Sequence[str],
        temperature: float,
        denoise: bool = True,
        max_length: int = 64,
        head: nn.Module | None = None,
    ) -> None:
        super().__init__()
        if len(templates) != 2:
            raise ValueError(f"prompt contrastive training needs two templates, got {len(templates)}")
        self.poolers = [
            PromptPooler(tokenizer, PromptSettings(t, denoise=denoise), max_length) for t in templates
        ]
        self.temperature, self.head = temperature, head

    def views(self, model: nn.Module, sentences: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        device = next(model.parameters()).device
        views = []
        for pooler in self.poolers:
            batch = pooler.tokenize(sentences)
            z = pooler(model, batch["input_ids"].to(device), batch["attention_mask"].to(device))
            views.append(self.head(z) if self.head is not None else z)
        return views[0], views[1]

    def forward(self, model: nn.Module, sentences: Sequence[str]) -> torch.Tensor:
        z1, z2 = self.views(model, sentences)
        return info_nce(z1, z2, self.temperature)


class PromptBERTObjective(nn.Module):
    """PromptBERT as one of sentcl.training.objectives' pieces (``representations(embed, items)`` -> ``loss(reps)``), so the
    trainer's gradient caching and all-gather apply unchanged. ``examples``:

    - ``sentences`` (unsupervised, run.sh unsup-bert): two templates, each denoised, projection, InfoNCE;
    - ``triplets`` (supervised, run.sh sup-bert): (premise, entailment, contradiction) under the one template,
      denoised, supervised SimCSE (models.py ``cl_forward`` with ``num_sent == 3``, hard_negative_weight 0).
      The authors' sup-bert also trains BERT's MLM transform over the [MASK] state (``org_mlp``): not here.

    ``contrastive``: the unsupervised loss (``sentcl.training.losses.info_nce``, the paper's; the trainer passes its
    ``loss`` setting). Triplets always use supervised SimCSE, as ``sentcl.training.objectives.contrastive.SupSimCSE``.

    The encoder runs in whatever train/eval mode the trainer set (dropout), under the Embedder's autocast.
    """

    head_parameters: tuple[str, ...] = ()

    def __init__(
        self,
        tokenizer,
        templates: Sequence[str],
        temperature: float,
        denoise: bool,
        max_length: int,
        examples: str = "sentences",
        projection: nn.Module | None = None,
        contrastive: Callable[..., torch.Tensor] = info_nce,
    ) -> None:
        super().__init__()
        if examples not in ("sentences", "triplets"):
            raise ValueError(f"PromptBERT trains on sentences or triplets, not {examples!r}")
        wanted = 2 if examples == "sentences" else 1
        if len(templates) != wanted:
            raise ValueError(f"PromptBERT on {examples} needs {wanted} template(s), got {len(templates)}")
        self.examples, self.temperature, self.projection = examples, temperature, projection
        self.contrastive = contrastive
        self.poolers = [
            PromptPooler(tokenizer, PromptSettings(t, denoise=denoise), max_length) for t in templates
        ]
        for pooler in self.poolers:  # say so before training, not at the first batch
            if pooler.template.length >= max_length:
                raise ValueError(
                    f"max_length {max_length} leaves no room for a sentence in the {pooler.template.length}-token "
                    f"template {pooler.template.template!r}"
                )

    def _pool(self, embed, pooler: PromptPooler, sentences: Sequence[str]) -> torch.Tensor:
        batch = pooler.tokenize(sentences)
        model = embed.encoder.model
        input_ids, attention_mask = (
            batch["input_ids"].to(embed.device),
            batch["attention_mask"].to(embed.device),
        )
        chunks = embed.chunks(attention_mask)
        with embed.autocast():
            if chunks is None:
                return pooler(model, input_ids, attention_mask)
            # The [MASK] states in length-sorted chunks (train.chunk_tokens), the delta once for the batch.
            template = pooler.template

            def states(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
                return prompt_states(model, input_ids, attention_mask, template)

            tensors = {"input_ids": input_ids, "attention_mask": attention_mask}
            z = run_in_chunks(states, model, chunks, tensors)
            return denoise_batch(model, z, attention_mask, template) if pooler.settings.denoise else z

    def representations(self, embed, items: Sequence) -> dict[str, torch.Tensor]:
        if self.examples == "sentences":
            return {
                "z1": self._pool(embed, self.poolers[0], items),
                "z2": self._pool(embed, self.poolers[1], items),
            }
        a, p, n = zip(*items, strict=True)
        anchor, positive, negative = self._pool(embed, self.poolers[0], [*a, *p, *n]).chunk(3)
        return {"anchor": anchor, "positive": positive, "negative": negative}

    def project(self, z: torch.Tensor) -> torch.Tensor:
        return self.projection(z.float()) if self.projection is not None else z

    def loss(self, reps: dict[str, torch.Tensor], negatives: torch.Tensor | None = None) -> torch.Tensor:
        if self.examples == "sentences":
            return self.contrastive(
                self.project(reps["z1"]), self.project(reps["z2"]), self.temperature, negatives
            )
        return sup_simcse(reps["anchor"], reps["positive"], reps["negative"], self.temperature)
