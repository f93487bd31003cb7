"""Embedding a file of sentences, one a line: the input checks, the encoder a model folder needs, and the output
file by suffix (``.npy``, ``.jsonl``, ``.csv``, ``.parquet``), written beside its target and moved into place.

Each distinct line is encoded once, in one length-sorted pass (:mod:`sentcl.model.fast_encode`) when the folder is a
pipeline the fast encoder reproduces exactly, else by sentcl's encoder (a carried pooling) or by
sentence-transformers itself.
"""

from __future__ import annotations

import csv
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

SUFFIXES = (".npy", ".jsonl", ".csv", ".parquet")
EMBED_BACKENDS = ("auto", "onnx", "int8", "sentence-transformers")
PROGRESS_FROM = 1000  # lines; shorter inputs finish before a bar would be useful


class EmbedInputError(ValueError):
    """Input the command refuses; the message is the one line it prints."""


# --------------------------------------------------------------------------------------------- input checks


def check_output(path: Path) -> None:
    if path.suffix.lower() not in SUFFIXES:
        raise EmbedInputError(
            f"{path}: unsupported output suffix {path.suffix or '(none)'!r}; use {', '.join(SUFFIXES)}"
        )
    if path.is_dir():
        raise EmbedInputError(f"{path}: is a folder; --output names a file")


def read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file (``\\n`` or ``\\r\\n``; a final newline ends the last line)."""
    if not path.exists():
        raise EmbedInputError(f"{path}: no such file")
    if path.is_dir():
        raise EmbedInputError(f"{path}: is a folder; --input takes a text file, one sentence a line")
    data = path.read_bytes()
    if b"\0" in data:
        line = data[: data.index(b"\0")].count(b"\n") + 1
        raise EmbedInputError(f"{path}:{line}: binary data (NUL byte); give UTF-8 text, one sentence a line")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise EmbedInputError(f"{path}:{line}: not UTF-8 text ({error.reason})") from None
    if not text:
        raise EmbedInputError(f"{path}: is empty; nothing to embed")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


# --------------------------------------------------------------------------------------------- the encoder


def fast_settings(folder: Path) -> tuple[str, bool] | None:
    """(pooling, normalize) when ``folder`` is a Transformer + Pooling (+ Normalize) pipeline the fast encoder
    reproduces exactly; None for anything else (then sentence-transformers itself encodes)."""
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return "last-avg", False  # a plain Hugging Face folder: sentence-transformers adds mean pooling
    pooling, normalize = None, False
    for module in json.loads(modules_file.read_text()):
        kind = module.get("type", "").rsplit(".", 1)[-1]
        if kind == "Transformer":
            config = folder / module.get("path", "") / "sentence_bert_config.json"
            if config.is_file() and json.loads(config.read_text()).get("do_lower_case"):
                return None
        elif kind == "Pooling":
            config = json.loads((folder / module.get("path", "") / "config.json").read_text())
            # sentence-transformers 6 writes "pooling_mode": "mean"; older versions one boolean per mode.
            mode = config.get("pooling_mode")
            if mode is None:
                modes = [
                    k.removeprefix("pooling_mode_")
                    for k, v in config.items()
                    if k.startswith("pooling_mode_") and v is True
                ]
                mode = modes[0] if len(modes) == 1 else None
            pooling = {"mean": "last-avg", "mean_tokens": "last-avg", "cls": "cls", "cls_token": "cls"}.get(
                mode
            )
            if pooling is None:
                return None
        elif kind == "Normalize":
            normalize = True
        else:
            return None
    return (pooling, normalize) if pooling else None


def make_encoder(
    folder: Path, max_batch: int, progress: bool, backend: str = "auto"
) -> tuple[Callable, Callable[[], int], str]:
    """(encode(sentences) -> float32 [n, dim], truncated-count of the last call, backend name).

    ``backend``: ``auto`` (the fast path where it is exact, else sentence-transformers), ``onnx`` or ``int8``
    (the fast path, refused where it does not apply), ``sentence-transformers`` (its own ``encode``)."""
    from sentcl.model.fast_encode import FastEncoder
    from sentcl.model.folder import count_truncated
    from sentcl.model.pooling import read_model_pooling
    from sentcl.model.quantize import INT8_FILE

    if backend not in EMBED_BACKENDS:
        raise EmbedInputError(f"unknown backend {backend!r}; choose one of {', '.join(EMBED_BACKENDS)}")
    if backend == "int8" and not (folder / INT8_FILE).is_file():  # before any model is loaded
        raise EmbedInputError(
            f"{folder}: no {INT8_FILE}; the export stage writes it when int8 is within tolerance of fp32"
        )
    fast = backend in ("onnx", "int8")
    if fast and (read_model_pooling(folder) is not None or fast_settings(folder) is None):
        raise EmbedInputError(
            f"{folder}: --backend {backend} serves Transformer + mean/CLS Pooling folders; use --backend auto"
        )
    if backend == "auto" and read_model_pooling(folder) is not None:  # a carried pooling (PromptBERT)
        from sentcl.model.encoder import load_folder_encoder

        carried = load_folder_encoder(folder)
        counted_carried = {"n": 0}

        def encode_carried(sentences: list[str]) -> np.ndarray:
            counted_carried["n"] = count_truncated(carried.tokenizer, sentences, carried.max_length)
            return np.asarray(carried.encode(sentences, batch_size=max_batch), dtype=np.float32)

        return (
            encode_carried,
            lambda: counted_carried["n"],
            f"torch, {carried.pooling}, max {carried.max_length} tokens",
        )

    settings = fast_settings(folder) if backend != "sentence-transformers" else None
    if settings is not None:
        pooling, normalize = settings
        fast_backend = "int8" if backend == "int8" else "onnx"  # onnx falls back to torch, with a warning
        encoder = FastEncoder(
            folder, pooling=pooling, max_batch=max_batch, progress=progress, backend=fast_backend
        )

        def encode(sentences: list[str]) -> np.ndarray:
            vectors = encoder(sentences)
            if normalize:  # sentence-transformers' Normalize: x / max(||x||, 1e-12)
                vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
            return vectors

        return (
            encode,
            lambda: encoder.last_truncated,
            f"{encoder.backend}, {pooling}, max {encoder.max_length} tokens",
        )

    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    counted = {"n": 0}

    def encode_st(sentences: list[str]) -> np.ndarray:
        counted["n"] = count_truncated(model.tokenizer, sentences, model.max_seq_length)
        return np.asarray(
            model.encode(sentences, batch_size=max_batch, show_progress_bar=progress), dtype=np.float32
        )

    return encode_st, lambda: counted["n"], f"sentence-transformers, max {model.max_seq_length} tokens"


# --------------------------------------------------------------------------------------------- output


def _umask() -> int:
    mask = os.umask(0)  # reading it means setting it: put it straight back
    os.umask(mask)
    return mask


def write_vectors(path: Path, lines: list[str], vectors: np.ndarray) -> None:
    """Write by suffix into a temporary file beside ``path``, then replace ``path`` with it."""
    suffix = path.suffix.lower()
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(handle, "wb") as raw:
            if suffix == ".npy":
                np.save(raw, vectors.astype(np.float32, copy=False))
        if suffix == ".jsonl":
            with open(tmp, "w", encoding="utf-8") as out:
                for sentence, vector in zip(lines, vectors, strict=True):
                    out.write(json.dumps({"sentence": sentence, "embedding": vector.tolist()}) + "\n")
        elif suffix == ".csv":
            with open(tmp, "w", encoding="utf-8", newline="") as out:
                writer = csv.writer(out)
                writer.writerow(["sentence", *(f"e{i}" for i in range(vectors.shape[1]))])
                for sentence, vector in zip(lines, vectors, strict=True):
                    writer.writerow([sentence, *vector.tolist()])
        elif suffix == ".parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1))
            table = pa.table(
                {
                    "sentence": pa.array(lines, pa.string()),
                    "embedding": pa.FixedSizeListArray.from_arrays(flat, vectors.shape[1]),
                }
            )
            pq.write_table(table, tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; the output gets what open() would give it
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# --------------------------------------------------------------------------------------------- embedding


def embed(
    lines: list[str],
    output: Path,
    folder: Path,
    max_batch: int = 64,
    progress: bool = True,
    backend: str = "auto",
) -> dict[str, object]:
    """Encode each distinct line once, write one row per line; return what was done."""
    unique = list(dict.fromkeys(lines))
    encode, truncated, backend = make_encoder(
        folder, max_batch, progress and len(unique) >= PROGRESS_FROM, backend
    )
    vectors = encode(unique)
    position = {sentence: i for i, sentence in enumerate(unique)}
    rows = vectors[np.fromiter((position[s] for s in lines), dtype=np.int64, count=len(lines))]
    write_vectors(output, lines, rows)
    return {"lines": len(lines), "unique": len(unique), "truncated": truncated(), "backend": backend}
