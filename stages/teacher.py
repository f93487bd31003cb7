"""Stage ``teacher``: the distillation teacher's vectors of the training text -> data/teacher.

    python -m stages.teacher                      # DVC stage: params ``teacher``, ``transfer.texts``
    python -m stages.teacher --model DIR --output OUT [--texts FILE_OR_CHOICE]

``teacher.model``: ``none`` (the feature is off: an empty record, nothing loaded), ``all-mpnet-base-v2`` (the
offline default: from its five PyPI pieces, sha256-checked; ``sentcl.training.teacher_run``), a sentence-transformers
folder, or a ``models:/name/version`` / ``models:/name@alias`` URI of the registry. The output and its sentences
(the transfer text, ``transfer.texts`` and ``transfer.max_texts``, each once: only what a later stage reads; the
teacher's own STS scores are ``python -m benchmarks.teacher_ceiling``'s): ``sentcl.training.teacher_run``.

A retrain (flows/retrain.py, benchmarks/bench_domain.py) adds ``--domain-dev PAIRS``: the pairs' sentences are
encoded too and ``teacher.json`` records the teacher's Spearman x 100 on them (``domain_dev``), from the stored fp16
vectors the transfer learns from; ``--student MODEL`` adds the starting model's, encoded the same way, so the
two numbers differ only by the model. A label-free retrain adds ``--heldout FILE --heldout-gate FILE``: the two
parts of its held-out sentences (selection's, the gate's), encoded too, and ``agreement-selection.tsv`` and
``agreement-gate.tsv``, pairs built within each part only (``sentcl.retrain.agreement``).

Bad input (a missing package, a hash that does not match, a folder that does not load): one line, exit 2, and
data/teacher untouched.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path
from typing import Any

from sentcl.model import teacher as T
from sentcl.params import ParamsError
from sentcl.retrain.agreement import AGREEMENT_FILES, AgreementConfig, agreement_lines
from sentcl.training import teacher_run as R
from stages.common import DATA, RAW, ROOT, fail, load_params, offline_hub, params_arguments
from stages.training import load_nli, load_pairs

log = logging.getLogger("stages.teacher")
OUTPUT = DATA / "teacher"


def teacher_folder(model: str, settings: T.TeacherConfig, scratch: Path) -> Path:
    if not model.startswith("models:/"):
        return R.local_teacher(model, settings, ROOT)
    from sentcl_mlflow.registry.download import download_model

    try:
        return download_model(model, scratch)
    except Exception as exc:  # unknown name or version, weights mismatch
        from sentcl_mlflow.errors import unreachable

        if unreachable(exc):  # try again later (exit 75), not a wrong teacher.model
            raise
        raise T.TeacherError(f"teacher.model {model}: {type(exc).__name__}: {exc}") from None


def run(
    params: dict[str, Any],
    output: Path,
    model: str | None,
    texts: str | None,
    raw: Path,
    processed: Path,
    domain_dev: Path | None = None,
    student: str | None = None,
    heldout: dict[str, Path] | None = None,
) -> dict[str, Any]:
    """The record of ``model`` (default ``teacher.model``) -> ``output``; its meta. Bad input: ``TeacherError``.
    With ``heldout`` (a domain text's held-out sentences by part, ``selection`` and ``gate``; never trained on),
    also ``output/agreement-<part>.tsv`` for each part: pairs among that part's sentences scored by the teacher
    (``sentcl.retrain.agreement``), the label-free dev sets of selection and of the gate."""
    settings = T.TeacherConfig.from_params(params)
    pairs = R.read_dev_pairs(domain_dev)
    held = {part: R.read_heldout(path) for part, path in (heldout or {}).items()}
    agreement = AgreementConfig.from_params(params) if held else None
    model = model or settings.model
    if model == "none":
        R.write_record(R.none_record(), output)
        log.info("teacher: none (distillation off)")
        return {"model": "none"}
    with tempfile.TemporaryDirectory(prefix="sentcl-teacher-model-") as scratch:
        # The teacher first: a bad one is refused before any text is read.
        folder = teacher_folder(model, settings, Path(scratch))
        encoder = R.open_encoder(folder, settings.backend, settings.max_tokens)
        tables = load_pairs(processed), load_nli(processed)
        extra = [*R.pair_sentences(pairs), *(s for part in held.values() for s in part)]
        sentences = R.sentences_to_encode(params, texts, raw, *tables, extra, log)
        record = R.encode(encoder, sentences, model, folder, settings, pairs, student)
    files = {}
    for part, sentences in held.items():
        lines = agreement_lines(record, sentences, agreement, params["seed"], part)
        files[AGREEMENT_FILES[part]] = "".join(lines)
        log.info("teacher: held-out %s part -> %s", part, record.meta["agreement"][part])
    R.write_record(record, output, files)
    for line in R.summary_lines(record):
        log.info(line)
    return record.meta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="override teacher.model: none, all-mpnet-base-v2, DIR or models:/...")
    parser.add_argument("--texts", help="override transfer.texts")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    parser.add_argument("--raw", type=Path, default=RAW)
    parser.add_argument("--processed", type=Path, default=DATA / "processed")
    params_arguments(parser)
    parser.add_argument(
        "--domain-dev",
        type=Path,
        help="scored pairs (s1<TAB>s2<TAB>score): encode them, record the teacher's score",
    )
    parser.add_argument("--student", help="with --domain-dev: also score this model (folder) on those pairs")
    parser.add_argument(
        "--heldout",
        type=Path,
        help="selection's part of a domain text's held-out sentences: encode them, write agreement-selection.tsv",
    )
    parser.add_argument(
        "--heldout-gate",
        type=Path,
        help="the gate's part of the held-out sentences: encode them, write agreement-gate.tsv",
    )
    args = parser.parse_args(argv)
    if args.student and not args.domain_dev:
        fail("teacher: --student is scored on --domain-dev pairs; give them too")
    heldout = {
        part: path for part, path in (("selection", args.heldout), ("gate", args.heldout_gate)) if path
    }
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    offline_hub()
    params = load_params(args.params, args.overrides)
    try:
        from sentcl_mlflow.store import TrackingConfig, bound_requests

        bound_requests(TrackingConfig.from_params(params))  # a models:/ teacher's download
        run(
            params,
            args.output,
            args.model,
            args.texts,
            args.raw,
            args.processed,
            args.domain_dev,
            args.student,
            heldout,
        )
    except (T.TeacherError, ParamsError) as exc:
        fail(str(exc))
    return 0


if __name__ == "__main__":
    from sentcl_mlflow.errors import run_main

    raise SystemExit(run_main("teacher", main))
