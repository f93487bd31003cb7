"""TSDAE (Wang et al., 2021): rebuild each sentence from the vector of a damaged copy."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from torch import nn

from sentcl.model.encoder import Encoder
from sentcl.training.objectives.base import Embedder, Objective, Reps

log = logging.getLogger(__name__)


class _EmbeddedSentences:
    """What ``DenoisingAutoEncoderLoss`` reads of a SentenceTransformer, for an encoder that runs elsewhere.

    The library builds its decoder from ``transformers_model`` (config, folder, weights to tie) and tokenizer;
    at loss time it calls the "model" on the source features, and here those already hold the sentence vectors
    (the trainer's ``Embedder`` made them, with its hook, autocast and gradient caching).
    """

    def __init__(self, encoder: Encoder) -> None:
        self.transformers_model, self.tokenizer = encoder.model, encoder.tokenizer

    def __getitem__(self, index: int) -> nn.Module:  # the library checks model[0] is no StaticEmbedding
        return self.transformers_model

    def __call__(self, features: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return features


class TSDAE(Objective):
    """TSDAE (Wang, Reimers & Gurevych 2021): from the vector of a damaged sentence, a decoder must rebuild the
    sentence. Decoder, weight tying and loss are sentence-transformers' ``DenoisingAutoEncoderLoss``
    (``sentence_transformers/sentence_transformer/losses/denoising_auto_encoder.py``); the encoder pass is the
    trainer's, pooled last-avg as everywhere in sentcl (the paper's best is CLS, with mean close behind).

    Noise (``DenoisingAutoEncoderDataset.delete`` in the same package, the paper's deletion ratio 0.6): each
    word is deleted with probability ``deletion_ratio`` and at least one is kept. Words are whitespace tokens,
    not nltk's ``word_tokenize``: SentEval text is already tokenised, and nltk's data cannot be downloaded here.
    The noise draws from the views' generator, so gradient caching replays it.

    The decoder is ``AutoModelForCausalLM`` of the encoder's own folder with cross-attention, tied to the
    encoder (``tie_encoder_decoder=True``): embeddings and every self-attention and feed-forward weight are
    shared. A folder saved as a sentence encoder (the bundled all-MiniLM-L6-v2, every sentcl model) has no LM
    head, so each layer's cross-attention and the LM head's transform start random (the output projection is the
    tied word embeddings): 3.7M fresh parameters next to 22.6M shared for MiniLM-L6 (measured). Until they
    learn, their gradients reach the shared weights as noise: the first steps can lower the encoder's scores,
    which is why a retrain selects on dev scores and keeps its init when no step helps.
    """

    def __init__(self, encoder: Encoder, deletion_ratio: float) -> None:
        super().__init__()
        from sentence_transformers.sentence_transformer.losses import DenoisingAutoEncoderLoss
        from transformers.utils import logging as hf_logging

        if not encoder.model.config._name_or_path:
            raise ValueError(
                "TSDAE builds its decoder from the encoder's folder: load it with from_pretrained"
            )
        weights = {k: v.detach().clone() for k, v in encoder.model.state_dict().items()}
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # the decoder's load report lists every fresh weight; one line below
        try:
            self.dae = DenoisingAutoEncoderLoss(_EmbeddedSentences(encoder), tie_encoder_decoder=True)
        finally:
            hf_logging.set_verbosity(verbosity)
        # Tying hands the encoder the decoder's weights, read from the folder: put back the ones in memory.
        encoder.model.load_state_dict(weights)
        self.deletion_ratio, self.max_length = deletion_ratio, encoder.max_length
        self.pad_id = self.dae.tokenizer_decoder.pad_token_id
        shared = {id(p) for p in encoder.model.parameters()}
        fresh = sum(p.numel() for p in self.dae.decoder.parameters() if id(p) not in shared)
        total = sum(p.numel() for p in self.dae.decoder.parameters())
        log.info(
            "TSDAE decoder: %d parameters, %d fresh (cross-attention, LM-head transform), the rest tied",
            total,
            fresh,
        )

    def damage(self, sentence: str, generator: torch.Generator) -> str:
        words = sentence.split()
        if not words:
            return sentence
        keep = torch.rand(len(words), generator=generator) > self.deletion_ratio
        if not keep.any():
            keep[torch.randint(len(words), (1,), generator=generator)] = True
        return " ".join(w for w, k in zip(words, keep.tolist(), strict=True) if k)

    def representations(self, embed: Embedder, items: Sequence[str]) -> Reps:
        damaged = [self.damage(s, embed.generator) for s in items]
        # Targets padded to max_length so that gradient caching can stack micro-batches; loss() trims them.
        targets = embed.encoder.tokenizer(
            list(items),
            padding="max_length",
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
        )
        return {"z": embed(embed.tokenize(damaged)), "target_ids": targets["input_ids"].to(embed.device)}

    def loss(self, reps: Reps, negatives: torch.Tensor | None = None) -> torch.Tensor:
        ids = reps["target_ids"]
        ids = ids[:, : int((ids != self.pad_id).sum(1).max())]  # columns that are padding in every row go
        z = reps["z"].float()
        source = {
            "sentence_embedding": z,
            "attention_mask": torch.ones(len(z), 1, dtype=torch.long, device=z.device),
        }
        return self.dae([source, {"input_ids": ids}], labels=None)
