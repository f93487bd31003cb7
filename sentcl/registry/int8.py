"""The release folder's int8 graph: quantise, score on the STS benchmark, ship only within tolerance of fp32.

fp32's scores are the evaluate stage's row for the checkpoint (the candidates' table the export reads): the same
benchmark, and fp32 ONNX equals torch to 1e-4, so the row is what the fp32 graph scores. The int8 graph is scored
with the fast encoder's ``int8`` backend, which is how it is served. The rule (``within_tolerance``) reads the dev
splits only; the seven test tasks are reported beside fp32's, never used to decide.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sentcl.model.quantize import (
    FP32_FILE,
    INT8_FILE,
    QuantizeConfig,
    calibration_sample,
    dev_drops,
    quantize,
    within_tolerance,
)


def score_int8(
    folder: Path, data_root: Path, pooling: str, max_length: int, prompt: dict | None = None
) -> dict:
    """Benchmark scores (seven tasks, STS-B dev, SICK-R trial) of ``folder``'s int8 graph."""
    from sentcl.evaluation.benchmark import load_benchmark, score_vectors
    from sentcl.model.fast_encode import FastEncoder
    from sentcl.model.pooling import PromptSettings

    benchmark = load_benchmark(data_root)
    settings = PromptSettings(**prompt) if prompt else None
    encoder = FastEncoder(folder, pooling=pooling, max_length=max_length, backend="int8", prompt=settings)
    sentences = benchmark.sentences
    return score_vectors(benchmark, sentences, encoder(sentences))


def build_int8(
    folder: Path,
    config: QuantizeConfig,
    fp32_row: Mapping[str, Any],
    onnx_report: Mapping[str, Any],
    *,
    data_root: Path,
    max_length: int,
    calibration: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Write ``folder/onnx/model_int8.onnx``, score it, and keep it only when the dev splits hold; the record
    of what was done (``export.json``'s ``int8``, the card, metrics/export.json). ``calibration``: the training
    text, needed by ``static``."""
    record: dict[str, Any] = {"method": config.int8_method, "max_dev_drop": config.int8_max_dev_drop}
    if config.int8_method == "none":
        return record | {"shipped": False, "file": None, "reason": "export.int8_method is none"}
    if not (Path(data_root) / "STS").is_dir():  # nothing to measure it on: nothing unmeasured ships
        return record | {
            "shipped": False,
            "file": None,
            "reason": f"int8 not shipped: no benchmark at {data_root}",
        }
    target = folder / INT8_FILE
    started = time.time()
    sample: list[str] = []
    tokenize = None
    if config.int8_method == "static":
        from sentcl.model.encoder import Encoder

        sample = calibration_sample(calibration or [], config.calibration_sentences)
        if not sample:
            raise ValueError(
                "static int8 quantisation needs the training text to calibrate on; none was given"
            )
        encoder = Encoder.from_pretrained(str(folder), max_length=max_length)  # the graph's own tokenization

        def tokenize(batch: list[str]) -> dict[str, Any]:
            return {k: v.numpy() for k, v in encoder.tokenize(batch).items()}

    quantize(
        folder / FP32_FILE,
        target,
        config.int8_method,
        config.int8_per_channel,
        tokenize=tokenize,
        sentences=sample,
    )
    record |= {
        "per_channel": config.int8_per_channel,
        "calibration_sentences": len(sample),
        "quantize_seconds": round(time.time() - started, 1),
        "bytes": target.stat().st_size,
        "fp32_bytes": (folder / FP32_FILE).stat().st_size,
    }
    started = time.time()
    scores = score_int8(folder, data_root, onnx_report["pooling"], max_length, onnx_report.get("prompt"))
    record["score_seconds"] = round(time.time() - started, 1)
    record |= {k: scores[k] for k in ("all", "stsb_dev", "sick_dev") if k in scores}
    record["fp32"] = {k: fp32_row[k] for k in ("all", "stsb_dev", "sick_dev") if fp32_row.get(k) is not None}
    record["dev_drops"] = dev_drops(fp32_row, scores)
    record["shipped"] = within_tolerance(record["dev_drops"], config.int8_max_dev_drop)
    if record["shipped"]:
        record["file"] = INT8_FILE
        record["sha256"] = hashlib.sha256(target.read_bytes()).hexdigest()  # for a registry manifest to check
    else:
        target.unlink()  # a folder holds the int8 graph only when it is fit to serve
        record["file"] = None
        if record["dev_drops"]:
            split, drop = max(record["dev_drops"].items(), key=lambda kv: kv[1])
            why = f"{split} drops {drop:.2f} > export.int8_max_dev_drop {config.int8_max_dev_drop}"
        else:
            why = "fp32 has no dev score to compare with"
        record["reason"] = f"int8 not shipped: {why}; fp32 only"
    return record
