"""The one place that turns a ``TrainConfig`` into its objective: it reads ``mode`` and ``objective``, and builds
the contrastive term that distillation wraps (as sentence-transformers passes an inner loss into a wrapper loss)."""

from __future__ import annotations

from typing import Any

from sentcl.model.encoder import Encoder
from sentcl.training.losses import MLPProjection
from sentcl.training.objectives.base import CONTRASTIVE_LOSSES, Objective
from sentcl.training.objectives.contrastive import Contrastive, Joint, NLIClassifier, SupSimCSE
from sentcl.training.objectives.distill import Distill
from sentcl.training.objectives.promptbert import PromptBERTObjective
from sentcl.training.objectives.tsdae import TSDAE


def build_objective(config: Any, dim: int, encoder: Encoder | None = None, teacher: Any = None) -> Objective:
    """The objective of a ``TrainConfig``: the one place that reads ``mode`` and ``objective``. TSDAE builds its
    decoder from (and ties it to) ``encoder``; PromptBERT tokenizes with its tokenizer; distill reads the
    ``teacher``'s stored vectors (``sentcl.model.teacher.TeacherVectors``)."""
    if config.objective == "distill":  # sentcl/training/objectives/distill.py
        return _distill(config, dim, teacher)
    if config.objective == "promptbert":
        return _promptbert(config, dim, encoder)
    if config.mode == "transfer" and config.objective == "tsdae":
        if encoder is None:
            raise ValueError("the tsdae objective needs the encoder to build its decoder from")
        return TSDAE(encoder, config.deletion_ratio)
    contrastive = _contrastive(config, dim, config.alpha)
    if config.mode == "transfer":
        return contrastive
    if config.mode == "joint":
        return Joint(dim, config.max_square, contrastive)
    if config.objective == "sup_simcse":
        return SupSimCSE(config.temperature)
    return NLIClassifier(dim, config.max_square)


def _promptbert(config: Any, dim: int, encoder: Encoder | None) -> PromptBERTObjective:
    """kongds/Prompt-BERT prompt_bert/models.py ``cl_forward``: transfer mode is run.sh unsup-bert (two templates,
    each denoised by its own delta, MLP head, InfoNCE); nli mode is sup-bert (anchor, entailment and contradiction
    under the one template, each denoised, supervised SimCSE; sup-bert has no MLPLayer: ``TrainConfig`` refuses
    ``projection`` in nli mode)."""
    if encoder is None:
        raise ValueError("the promptbert objective needs the encoder's tokenizer")
    sentences = config.mode == "transfer"
    return PromptBERTObjective(
        encoder.tokenizer,
        config.prompt.templates,
        config.temperature,
        config.prompt.denoise,
        config.max_length,
        examples="sentences" if sentences else "triplets",
        projection=MLPProjection(dim) if config.projection and sentences else None,
        contrastive=CONTRASTIVE_LOSSES[config.loss],
    )


def _distill(config: Any, dim: int, teacher: Any) -> Distill:
    """Distillation from the teacher's stored vectors, with the contrastive term it adds when
    ``distill.contrastive`` > 0 built here and passed in."""
    if teacher is None:
        raise ValueError("objective distill needs the teacher's vectors (stages.teacher)")
    settings = config.distill
    contrastive = _contrastive(config, dim, settings.contrastive) if settings.contrastive > 0 else None
    return Distill(settings, dim, teacher, contrastive)


def _contrastive(config: Any, dim: int, alpha: float) -> Contrastive:
    """The two-view contrastive term at weight ``alpha``: the transfer's own objective, or distillation's."""
    return Contrastive(
        config.loss,
        config.temperature,
        config.views,
        alpha,
        MLPProjection(dim) if config.projection else None,
    )
