"""Training objectives as small pieces: what examples each reads, which embeddings it needs, and its loss.

An objective turns a micro-batch of examples into the embeddings its loss needs (``representations``) and turns
those into a loss (``loss``). The split is what gradient caching needs: ``sentcl.training.gradcache.CachedLoss``
embeds every micro-batch first, computes the loss over the whole batch, then replays each micro-batch with gradient.

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
                                                (``sentcl.training.objectives.promptbert.PromptBERTObjective``)
=================  ===========================  =====================================================
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from sentcl.model.encoder import Encoder
from sentcl.training.losses import info_nce, nt_xent
from sentcl.training.objectives.chunks import embedding_output, length_chunks, run_in_chunks
from sentcl.training.views import ViewConfig, ViewInput, embedding_output_hook, make_view, position_offset

CONTRASTIVE_LOSSES: dict[str, Callable[..., torch.Tensor]] = {"nt_xent": nt_xent, "info_nce": info_nce}
Reps = dict[str, torch.Tensor]


class Embedder:
    """Runs the encoder on one view of a tokenized batch: the view's inputs, its embedding-output hook, autocast.

    Training pools with last-avg; the encoder's own dropout is whatever train/eval mode the trainer set.
    ``chunk_tokens`` (``train.chunk_tokens``): the view is made on the whole padded batch, then the encoder runs
    in length-sorted chunks of at most that many padded tokens (``sentcl.training.objectives.chunks``); 0 runs
    the whole batch padded to its longest sentence.
    """

    def __init__(
        self,
        encoder: Encoder,
        view_config: ViewConfig,
        generator: torch.Generator,
        device: torch.device,
        autocast_dtype: torch.dtype | None = None,
        chunk_tokens: int = 0,
    ) -> None:
        self.encoder, self.view_config, self.generator, self.device = encoder, view_config, generator, device
        self.autocast_dtype, self.chunk_tokens = autocast_dtype, chunk_tokens
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
        chunks = self.chunks(inputs.attention_mask)
        if chunks is not None:
            return self._chunked(inputs, chunks, capture)
        hook = perturb
        if capture is not None:

            def hook(output: torch.Tensor) -> torch.Tensor:
                output = perturb(output) if perturb else output
                capture.append(output)
                return output

        kwargs = {} if inputs.position_ids is None else {"position_ids": inputs.position_ids}
        with embedding_output_hook(self.encoder.model, hook), self.autocast():
            return self.encoder(inputs.input_ids, inputs.attention_mask, "last-avg", **kwargs)

    def autocast(self) -> torch.autocast:
        enabled = self.autocast_dtype is not None
        return torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.bfloat16, enabled=enabled)

    def chunks(self, attention_mask: torch.Tensor) -> list[tuple[list[int], int]] | None:
        """The chunks a batch with this mask runs in, or None for one padded forward."""
        return length_chunks(attention_mask, self.chunk_tokens) if self.chunk_tokens else None

    def _chunked(self, inputs: ViewInput, chunks: list, capture: list[torch.Tensor] | None) -> torch.Tensor:
        tensors = {"input_ids": inputs.input_ids, "attention_mask": inputs.attention_mask}
        if inputs.position_ids is not None:
            tensors["position_ids"] = inputs.position_ids
        model = self.encoder.model
        with self.autocast():
            # The batch's embedding output once, each chunk reading its rows (its own is dropped): the view's
            # cutoff masks and adversarial tensors are the whole padded batch's, and the word-embedding gradient
            # (a dense vocab x hidden matrix, 11.7M values for MiniLM) is then built once a backward instead of
            # once a chunk (that made the 128-sentence distillation step 2x slower than the padded one).
            embedded = embedding_output(model, **tensors)
            if inputs.embedding_output is not None:
                embedded = inputs.embedding_output(embedded)
            if capture is not None:
                capture.append(embedded)

            def forward(input_ids, attention_mask, **kwargs):
                return self.encoder(input_ids, attention_mask, "last-avg", **kwargs)

            return run_in_chunks(forward, model, chunks, tensors, embedded)


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
