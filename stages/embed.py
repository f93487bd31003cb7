"""Embed a file of sentences (one a line) with the champion, or any model.

    python -m stages.embed --input sentences.txt --output vectors.npy
    python -m stages.embed --input sentences.txt --output vectors.jsonl --model models/export
    python -m stages.embed --input sentences.txt --output vectors.parquet --model models:/sentcl-encoder@challenger

``--model`` is a sentence-transformers folder or a ``models:/`` URI; the default is the registry's champion, and
the command says which version that is. The output format follows the suffix: ``.npy`` (float32 matrix, row i =
line i), ``.jsonl`` (``{"sentence": ..., "embedding": [...]}`` per line), ``.csv`` (``sentence,e0,e1,...``) or
``.parquet`` (columns ``sentence``, ``embedding``); any other suffix is refused. Empty lines keep their row.

It is the evaluate stage's fast path (:mod:`sentcl.fast_encode`): each distinct line is encoded once, in one
length-sorted pass with batches bounded by a token budget, in ONNX Runtime worker processes. Vectors equal
``SentenceTransformer(folder).encode`` to float32 rounding. Lines longer than the model's limit are truncated (as
sentence-transformers does) and counted. Bad input (a missing, binary or non-UTF-8 file, a folder, an unsupported
suffix) is refused in one line with exit code 2, before any model is loaded or downloaded; an existing output file
is replaced only when the new one is complete.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from stages.common import load_params, offline_hub

SUFFIXES = (".npy", ".jsonl", ".csv", ".parquet")
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


# --------------------------------------------------------------------------------------------- the model


def resolve_model_path(model: str) -> str:
    """A folder, or the bundled model's name resolved to its package folder (imported late: torch is slow)."""
    from sentcl.encoder import resolve_model_path as resolve

    return resolve(model)


def resolve_model(model: str | None, scratch: Path, registered_name: str) -> tuple[Path, str]:
    """(a local sentence-transformers folder, how to name it). A registry model is looked up by version first,
    so the version named is the version downloaded even if the alias moves meanwhile."""
    if model and not model.startswith("models:/"):
        return Path(resolve_model_path(model)), model
    from sentcl_mlflow import registry as tracking

    name, alias, version = registered_name, tracking.CHAMPION, None
    if model:
        rest = model.removeprefix("models:/")
        if "@" in rest:
            name, alias = rest.split("@", 1)
        else:
            name, _, version = rest.partition("/")
            alias = None
    if alias is not None:
        version = tracking.alias_version(alias, name)
        if version is None:
            raise EmbedInputError(
                f"{name} has no version with alias {alias!r}; pass --model FOLDER or a models:/ URI"
            )
    label = f"{alias} = version {version} of {name}" if alias else f"version {version} of {name}"
    return tracking.download_model(f"models:/{name}/{version}", scratch), label


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


def make_encoder(folder: Path, max_batch: int, progress: bool) -> tuple[Callable, Callable[[], int], str]:
    """(encode(sentences) -> float32 [n, dim], truncated-count of the last call, backend name)."""
    from sentcl.fast_encode import FastEncoder, count_truncated
    from sentcl.model_pooling import read_model_pooling

    if read_model_pooling(folder) is not None:  # a pooling the folder carries (PromptBERT): sentcl's encoder
        from sentcl.encoder import load_folder_encoder

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

    settings = fast_settings(folder)
    if settings is not None:
        pooling, normalize = settings
        encoder = FastEncoder(folder, pooling=pooling, max_batch=max_batch, progress=progress)

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


# --------------------------------------------------------------------------------------------- command


def embed(
    lines: list[str], output: Path, folder: Path, max_batch: int = 64, progress: bool = True
) -> dict[str, object]:
    """Encode each distinct line once, write one row per line; return what was done."""
    unique = list(dict.fromkeys(lines))
    encode, truncated, backend = make_encoder(folder, max_batch, progress and len(unique) >= PROGRESS_FROM)
    vectors = encode(unique)
    position = {sentence: i for i, sentence in enumerate(unique)}
    rows = vectors[np.fromiter((position[s] for s in lines), dtype=np.int64, count=len(lines))]
    write_vectors(output, lines, rows)
    return {"lines": len(lines), "unique": len(unique), "truncated": truncated(), "backend": backend}


def quiet_loading() -> None:
    """No progress bar for loading or downloading a model (here and in the worker processes): the one bar
    an embed shows is its own, for inputs of 1,000 distinct lines or more."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Embed a file of sentences, one a line.")
    parser.add_argument("--input", type=Path, required=True, help="UTF-8 text, one sentence a line")
    parser.add_argument("--output", type=Path, required=True, help=" | ".join(SUFFIXES))
    parser.add_argument("--model", default=None, help="folder or models:/ URI (default: the champion)")
    parser.add_argument("--batch-size", type=int, default=64, help="most sentences in one batch")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    offline_hub()
    quiet_loading()
    try:
        check_output(args.output)
        lines = read_lines(args.input)
        if (
            args.model
            and not args.model.startswith("models:/")
            and not Path(resolve_model_path(args.model)).is_dir()
        ):
            raise EmbedInputError(f"{args.model}: no such model folder (or pass a models:/ URI)")
        registered = (load_params().get("registry") or {}).get("model_name", "sentcl-encoder")
        with tempfile.TemporaryDirectory(prefix="sentcl-embed-") as scratch:
            folder, label = resolve_model(args.model, Path(scratch), registered)
            print(f"embed: model = {label}", flush=True)
            done = embed(lines, args.output, folder, args.batch_size, not args.no_progress)
    except EmbedInputError as error:
        print(f"embed: {error}", file=sys.stderr)
        return 2
    except Exception as error:
        if type(error).__name__ in ("WeightsMismatchError", "ModelTamperedError"):
            print(f"embed: {error}", file=sys.stderr)  # the registered files were changed: nothing loaded
            return 2
        if getattr(error, "error_code", None) == "RESOURCE_DOES_NOT_EXIST":  # no such models:/ version
            print(f"embed: {args.model}: {error.message}", file=sys.stderr)
            return 2
        from sentcl_mlflow.errors import one_line  # the server died, hung (75) or refused (2)

        if (known := one_line("embed", error)) is None:
            raise
        print(known[1], file=sys.stderr)
        return known[0]
    truncated = f"; {done['truncated']} truncated to the model's limit" if done["truncated"] else ""
    print(
        f"embed: {done['lines']} lines ({done['unique']} distinct) -> {args.output} "
        f"[{label}; {done['backend']}]{truncated}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
