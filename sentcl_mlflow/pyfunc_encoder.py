"""The MLflow pyfunc that serves the encoder: sentences in, one vector per sentence out.

Logged as "models from code" (MLflow copies this file into the model, with ``sentcl_mlflow/pyfunc_checks.py``
in its ``code/``), so a loaded model needs only sentence-transformers, not this repository, and nothing is
pickled. Loaded from the registry, it first checks every file against the manifest of its registration. The
sentence-transformers folder travels as the artifact ``encoder``; vectors equal
``SentenceTransformer(folder).encode`` (mean pooling, no normalisation), which is what the exported folder gives.

A folder that carries prompt pooling (``sentcl_pooling.json``, PromptBERT) is served with it: the sentence in the
template, the last-layer state at [MASK], minus the template's delta when denoised. That arithmetic is written out
here again (this file must not import sentcl); tests/unit/training/test_prompt.py checks it equals ``sentcl.model.prompt``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlflow
import numpy as np

try:  # this repository's copy where it is installed; elsewhere the one the model carries in code/
    from sentcl_mlflow.pyfunc_checks import sentences as _sentences
    from sentcl_mlflow.pyfunc_checks import verify_loaded_model
except ImportError:
    from pyfunc_checks import sentences as _sentences
    from pyfunc_checks import verify_loaded_model

POOLING_FILE = "sentcl_pooling.json"  # sentcl/model/pooling.py
INT8_GRAPH = (
    "onnx/model_int8.onnx"  # sentcl/model/quantize.py INT8_FILE: the export's int8 copy, when it shipped
)
BACKENDS = (
    "torch",
    "int8",
)  # predict(params={"backend": ...}); torch is the folder as sentence-transformers runs it


class PromptEncoder:
    """PromptBERT pooling with transformers alone (sentcl/model/prompt.py ``tokenize_prompt``, ``template_delta``,
    ``prompt_pool``; kongds/Prompt-BERT prompt_bert/models.py ``get_delta``)."""

    def __init__(self, folder: str, settings: dict[str, Any]) -> None:
        import torch
        from sentence_transformers import SentenceTransformer

        # sentence-transformers loads the weights, tokenizer and max_seq_length; only the pooling is replaced.
        loaded = SentenceTransformer(folder, device="cpu")
        self.torch, self.settings = torch, settings
        self.tokenizer, self.model = loaded.tokenizer, loaded[0].auto_model.eval()
        self.max_length = int(loaded.max_seq_length)
        tok = self.tokenizer
        before, after = settings["template"].split("[X]")
        before_mask, after_mask = after.split("[MASK]")
        start, end = (lambda ids: (ids[:1], ids[1:]))(tok("", add_special_tokens=True)["input_ids"])

        def words(text: str) -> list[int]:
            text = text.strip()
            return tok(text, add_special_tokens=False)["input_ids"] if text else []

        self.prefix = start + words(before)
        self.suffix = words(before_mask) + [tok.mask_token_id] + words(after_mask) + end
        self.mask_at = self.suffix.index(tok.mask_token_id)
        with torch.no_grad():
            self.delta = self._delta(self.max_length - len(self.prefix) - len(self.suffix))

    def _delta(self, longest: int):
        torch = self.torch
        ids = torch.tensor([self.prefix + self.suffix]).repeat(longest + 1, 1)
        positions = torch.arange(ids.shape[1]).unsqueeze(0).repeat(longest + 1, 1)
        positions[:, len(self.prefix) :] += torch.arange(longest + 1).unsqueeze(-1)
        if getattr(self.model.config, "model_type", "") in (
            "roberta",
            "xlm-roberta",
            "camembert",
            "longformer",
        ):
            positions = positions + self.model.config.pad_token_id + 1
        hidden = self.model(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=positions)
        return hidden.last_hidden_state[:, len(self.prefix) + self.mask_at]

    def encode(self, sentences: list[str], batch_size: int = 64, **_: Any) -> np.ndarray:
        torch, tok = self.torch, self.tokenizer
        budget = self.max_length - len(self.prefix) - len(self.suffix)
        texts = [str(s).strip() for s in sentences]
        if self.settings.get("add_period"):
            texts = [s + "." if s and s[-1] not in ".?\"'" else s for s in texts]
        out = np.zeros((len(texts), self.model.config.hidden_size), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            chunk = texts[start : start + batch_size]
            rows = []
            for ids in tok(chunk, add_special_tokens=False)["input_ids"] if chunk else []:
                ids = [tok.unk_token_id if i == tok.mask_token_id else i for i in ids[:budget]]
                rows.append(self.prefix + ids + self.suffix)
            width = max(len(r) for r in rows)
            input_ids = torch.tensor([r + [tok.pad_token_id or 0] * (width - len(r)) for r in rows])
            lengths = torch.tensor([len(r) - len(self.prefix) - len(self.suffix) for r in rows])
            mask = torch.arange(width).unsqueeze(0) < (
                lengths + len(self.prefix) + len(self.suffix)
            ).unsqueeze(1)
            with torch.no_grad():
                hidden = self.model(input_ids=input_ids, attention_mask=mask.long()).last_hidden_state
            states = hidden[torch.arange(len(rows)), lengths + len(self.prefix) + self.mask_at]
            if self.settings.get("denoise"):
                states = states - self.delta[lengths]
            out[start : start + len(chunk)] = states.float().numpy()
        return out


class Int8Encoder:
    """The release's int8 ONNX graph (``onnx/model_int8.onnx``: ``input_ids``, ``attention_mask`` ->
    ``sentence_embedding``, pooling inside the graph, as the export stage writes it) run by ONNX Runtime on the
    folder's tokenizer, cut at the folder's ``max_seq_length``."""

    def __init__(self, folder: str) -> None:
        import onnxruntime as ort
        from transformers import AutoTokenizer

        graph = Path(folder) / INT8_GRAPH
        if not graph.is_file():
            raise ValueError(f"backend int8: this model has no {INT8_GRAPH} (the export did not ship one)")
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        config = Path(folder) / "sentence_bert_config.json"
        self.max_length = (
            json.loads(config.read_text()).get("max_seq_length", 512) if config.is_file() else 512
        )
        self.session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]

    def encode(self, sentences: list[str], batch_size: int = 64, **_: Any) -> np.ndarray:
        parts = []
        for start in range(0, len(sentences), batch_size):
            batch = self.tokenizer(
                sentences[start : start + batch_size],
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="np",
            )
            feeds = {name: batch[name].astype(np.int64) for name in self.inputs}
            parts.append(self.session.run(["sentence_embedding"], feeds)[0])
        return np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)


class SentenceEncoderModel(mlflow.pyfunc.PythonModel):
    # MLflow 3 checks `predict` for type hints when the class is created and, finding none, prints "Add type hints
    # to the `predict` method" in a way no warning filter reaches. It has none on purpose (below); this is
    # MLflow's own switch for a model that opts out of type-hint validation.
    _skip_type_hint_validation = True

    def load_context(self, context: Any) -> None:
        folder = context.artifacts["encoder"]
        verify_loaded_model(folder)  # before anything of it is read: ModelTamperedError on a changed file
        carried = Path(folder) / POOLING_FILE
        pooling = json.loads(carried.read_text()) if carried.is_file() else {}
        if pooling.get("pooling") == "prompt":
            self.model = PromptEncoder(folder, pooling["prompt"])
        elif pooling:
            raise ValueError(f"{carried}: pooling {pooling.get('pooling')!r} is not served; prompt or none")
        else:
            from sentence_transformers import SentenceTransformer

            self.model = SentenceTransformer(folder)
        self.folder, self.int8 = folder, None

    # No type hints here on purpose: MLflow 3 reads them as an input schema and would coerce the DataFrame that
    # `mlflow models serve` passes; the explicit signature logged with the model is the schema.
    def predict(self, context, model_input, params=None):  # noqa: ANN001, ANN201
        batch_size = int((params or {}).get("batch_size", 64))
        backend = (params or {}).get("backend", "torch")
        if backend not in BACKENDS:
            raise mlflow.exceptions.MlflowException.invalid_parameter_value(
                f"backend {backend!r} is not one of {', '.join(BACKENDS)}"
            )
        sentences = _sentences(model_input)
        model = self.model
        if backend == "int8":
            if self.int8 is None:
                try:
                    self.int8 = Int8Encoder(self.folder)
                except ValueError as exc:
                    raise mlflow.exceptions.MlflowException.invalid_parameter_value(str(exc)) from None
            model = self.int8
        return np.asarray(model.encode(sentences, batch_size=batch_size), dtype=np.float32)


mlflow.models.set_model(SentenceEncoderModel())
