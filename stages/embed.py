"""Embed a file of sentences (one a line) with the champion, or any model.

    python -m stages.embed --input sentences.txt --output vectors.npy
    python -m stages.embed --input sentences.txt --output vectors.jsonl --model models/export
    python -m stages.embed --input sentences.txt --output vectors.parquet --model models:/sentcl-encoder@challenger

``--model`` is a sentence-transformers folder or a ``models:/`` URI; the default is the registry's champion, and
the command says which version that is. The output format follows the suffix: ``.npy`` (float32 matrix, row i =
line i), ``.jsonl`` (``{"sentence": ..., "embedding": [...]}`` per line), ``.csv`` (``sentence,e0,e1,...``) or
``.parquet`` (columns ``sentence``, ``embedding``); any other suffix is refused. Empty lines keep their row.
``--backend int8`` runs the release folder's int8 graph (``onnx/model_int8.onnx``, written by the export stage
when it is within tolerance of fp32): faster on CPU, vectors close to fp32's but not equal; a folder without it
is refused in one line.

It is the evaluate stage's fast path (:mod:`sentcl.model.fast_encode`): each distinct line is encoded once, in one
length-sorted pass with batches bounded by a token budget, in ONNX Runtime worker processes. Vectors equal
``SentenceTransformer(folder).encode`` to float32 rounding. Lines longer than the model's limit are truncated (as
sentence-transformers does) and counted. Bad input (a missing, binary or non-UTF-8 file, a folder, an unsupported
suffix) is refused in one line with exit code 2, before any model is loaded or downloaded; an existing output file
is replaced only when the new one is complete.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from sentcl.model.embedding_io import (
    EMBED_BACKENDS,
    SUFFIXES,
    EmbedInputError,
    check_output,
    embed,
    read_lines,
)
from stages.common import argument_parser, load_params, offline_hub, params_arguments


def resolve_model_path(model: str) -> str:
    """A folder, or the bundled model's name resolved to its package folder (imported late: torch is slow)."""
    from sentcl.model.encoder import resolve_model_path as resolve

    return resolve(model)


def resolve_model(model: str | None, scratch: Path, registered_name: str) -> tuple[Path, str]:
    """(a local sentence-transformers folder, how to name it). A registry model is looked up by version first,
    so the version named is the version downloaded even if the alias moves meanwhile."""
    if model and not model.startswith("models:/"):
        return Path(resolve_model_path(model)), model
    from sentcl_mlflow.registry import download as tracking

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


def quiet_loading() -> None:
    """No progress bar for loading or downloading a model (here and in the worker processes): the one bar
    an embed shows is its own, for inputs of 1,000 distinct lines or more."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--input", type=Path, required=True, help="UTF-8 text, one sentence a line")
    parser.add_argument("--output", type=Path, required=True, help=" | ".join(SUFFIXES))
    parser.add_argument("--model", default=None, help="folder or models:/ URI (default: the champion)")
    parser.add_argument("--batch-size", type=int, default=64, help="most sentences in one batch")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument(
        "--backend",
        choices=EMBED_BACKENDS,
        default="auto",
        help="auto: ONNX fp32 where exact, else sentence-transformers; int8: the release's onnx/model_int8.onnx",
    )
    params_arguments(parser)
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
        params = load_params(args.params, args.overrides)
        registered = (params.get("registry") or {}).get("model_name", "sentcl-encoder")
        from sentcl.params import ParamsError
        from sentcl_mlflow.store import TrackingConfig, bound_requests

        try:
            bound_requests(TrackingConfig.from_params(params))  # a registered model's download
        except ParamsError as error:
            raise EmbedInputError(str(error)) from None
        with tempfile.TemporaryDirectory(prefix="sentcl-embed-") as scratch:
            folder, label = resolve_model(args.model, Path(scratch), registered)
            print(f"embed: model = {label}", flush=True)
            done = embed(lines, args.output, folder, args.batch_size, not args.no_progress, args.backend)
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
