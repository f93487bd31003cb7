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
``TSDAE``          sentences                    a decoder's CE rebuilding each sentence from the vector of a
                                                damaged copy (sentence-transformers' DenoisingAutoEncoderLoss)
``PromptBERT``     sentences (transfer) or      InfoNCE between a sentence's two templates, each denoised,
                   triplets (nli)               after the MLP head; supervised SimCSE under one template
                                                (``sentcl.prompt.PromptBERTObjective``)
=================  ===========================  =====================================================
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from sentcl.model.encoder import Encoder
from sentcl.training.losses import info_nce, nt_xent
from sentcl.training.views import ViewConfig, embedding_output_hook, make_view, position_offset

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
        # last-avg whatever the encoder is saved with: a prompt pooling's tokenization is PromptBERTObjective's
        return self.encoder.tokenize(sentences, pooling="last-avg").to(self.device)

    def __call__(
        self,
        batch: dict[str, torch.Tensor],
        view: str = "none",
        adversarial_grad: torch.Tensor | None = None,
        capture: list[torch.Tensor] | None = None,
        adversarial_base: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Sentence vectors of ``view`` of ``batch``; ``capture`` receives the (perturbed) embedding output;
        ``adversarial_base`` is the clean pass's embedding output the adversarial noise is added to."""
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
            adversarial_base=adversarial_base,
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

    def queue_entries(self, z: torch.Tensor) -> torch.Tensor:
        """What the momentum encoder's sentence vectors enter the queue as: the loss's own space."""
        return z
