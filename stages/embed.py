"""Embed a file of sentences (one a line) with the champion, or any model, in batches.

    python -m stages.embed --input sentences.txt --output vectors.npy
    python -m stages.embed --input sentences.txt --output vectors.jsonl --model models/export
    python -m stages.embed --input sentences.txt --output vectors.npy --model models:/sentcl-encoder@challenger

``--model`` is a sentence-transformers folder or a ``models:/`` URI; the default is the registry's champion.
The output format follows the suffix: ``.npy`` (float32 matrix, row i = line i) or ``.jsonl``
(``{"sentence": ..., "embedding": [...]}`` per line). Empty lines keep their row (a zero-length sentence).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from stages.common import offline_hub


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def batches(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def resolve_model(model: str | None, scratch: Path) -> Path:
    """A local sentence-transformers folder for ``model`` (downloaded from the registry for ``models:/``)."""
    from stages import tracking

    if model and not model.startswith("models:/"):
        return Path(model)
    if model is None:
        return tracking.download_alias(tracking.CHAMPION, scratch)
    return tracking.download_model(model, scratch)


def embed_file(input_path: Path, output_path: Path, model_dir: Path, batch_size: int = 256) -> int:
    """Write one vector per input line; batches bound memory on large files. Returns the number of lines."""
    from sentcl.encoder import load_folder_encoder

    sentences = read_lines(input_path)
    model = load_folder_encoder(model_dir)  # SentenceTransformer, or the pooling the folder carries (prompt)
    output_path.parent.mkdir(parents=True, exist_ok=True)
    if output_path.suffix == ".jsonl":
        with open(output_path, "w", encoding="utf-8") as out:
            for chunk in batches(sentences, batch_size):
                for sentence, vector in zip(chunk, model.encode(chunk, batch_size=batch_size), strict=True):
                    out.write(json.dumps({"sentence": sentence, "embedding": vector.tolist()}) + "\n")
    else:
        vectors = np.lib.format.open_memmap(
            output_path, mode="w+", dtype=np.float32, shape=(len(sentences), model.get_embedding_dimension())
        )
        for index, chunk in enumerate(batches(sentences, batch_size)):
            start = index * batch_size
            vectors[start : start + len(chunk)] = model.encode(chunk, batch_size=batch_size)
        vectors.flush()
    return len(sentences)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Embed a file of sentences, one a line.")
    parser.add_argument("--input", type=Path, required=True)
    parser.add_argument("--output", type=Path, required=True, help=".npy or .jsonl")
    parser.add_argument("--model", default=None, help="folder or models:/ URI (default: the champion)")
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args(argv)
    offline_hub()
    with tempfile.TemporaryDirectory(prefix="sentcl-embed-") as scratch:
        model_dir = resolve_model(args.model, Path(scratch))
        count = embed_file(args.input, args.output, model_dir, args.batch_size)
    print(f"embed: {count} sentences -> {args.output} ({model_dir if args.model else 'champion'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
