"""An int8 copy of a release folder's ONNX graph for CPU serving: ``onnx/model_int8.onnx``.

Two ways, both ONNX Runtime's: dynamic quantisation (weights int8 ahead of time, each activation's scale taken at
run time from the batch itself) and static quantisation (activation scales fixed ahead of time from a calibration
pass over sample text: the text the run trained on). Which one the export writes is ``export.int8_method`` in
params.yaml; the measurement behind the default is in docs/deployment.md. The graph keeps the fp32 graph's inputs
(``input_ids``, ``attention_mask``) and output (the pooled vector), so any code that runs one runs the other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from sentcl.params import flag, one_of, read_section, real_number, whole_number

FP32_FILE = "onnx/model.onnx"
INT8_FILE = "onnx/model_int8.onnx"
METHODS = ("dynamic", "static", "none")
CALIBRATION_BATCH = 32  # sentences per calibration batch: the activation ranges see many lengths per batch


@dataclass(frozen=True)
class QuantizeConfig:
    """params.yaml ``export``: how the int8 graph is made and when it ships (every key required)."""

    int8_method: str  # dynamic | static | none (fp32 only)
    int8_per_channel: bool  # one scale per output channel of each weight, not one per tensor
    int8_max_dev_drop: float  # int8 ships only if no dev split (STS-B dev, SICK-R trial) drops more than this
    calibration_sentences: int  # static: sentences of the training text the activation ranges come from

    @classmethod
    def from_params(cls, params: Mapping[str, Any], section: str = "export") -> QuantizeConfig:
        raw = read_section(params, section, [f.name for f in fields(cls)])
        one_of(raw["int8_method"], f"{section}.int8_method", METHODS)
        flag(raw["int8_per_channel"], f"{section}.int8_per_channel")
        drop = real_number(raw["int8_max_dev_drop"], f"{section}.int8_max_dev_drop", minimum=0)
        count = whole_number(raw["calibration_sentences"], f"{section}.calibration_sentences", minimum=1)
        return cls(raw["int8_method"], raw["int8_per_channel"], float(drop), count)


def calibration_sample(sentences: Sequence[str], count: int, seed: int = 0) -> list[str]:
    """``count`` distinct non-empty sentences drawn evenly at random (the same seed, the same sample)."""
    unique = [s for s in dict.fromkeys(s.strip() for s in sentences) if s]
    if len(unique) <= count:
        return unique
    picked = np.random.default_rng(seed).choice(len(unique), size=count, replace=False)
    return [unique[i] for i in sorted(picked)]


def _calibration_reader(tokenize: Callable[[list[str]], Mapping[str, Any]], sentences: Sequence[str]):
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        """Batches of the sample, tokenized as the graph expects (length-sorted: little padding to calibrate)."""

        def __init__(self) -> None:
            ordered = sorted(sentences, key=len)
            self._batches: Iterator[list[str]] = iter(
                [ordered[i : i + CALIBRATION_BATCH] for i in range(0, len(ordered), CALIBRATION_BATCH)]
            )

        def get_next(self) -> dict[str, np.ndarray] | None:
            batch = next(self._batches, None)
            if batch is None:
                return None
            tokens = tokenize(batch)
            return {
                name: np.asarray(tokens[name], dtype=np.int64) for name in ("input_ids", "attention_mask")
            }

    return Reader()


def quantize(
    source: Path,
    target: Path,
    method: str,
    per_channel: bool = False,
    *,
    tokenize: Callable[[list[str]], Mapping[str, Any]] | None = None,
    sentences: Sequence[str] = (),
    weight_type: str = "qint8",
) -> Path:
    """Write the int8 copy of the fp32 graph ``source`` to ``target``.

    Why dynamic QInt8 per-channel is the default (params.yaml ``export``; docs/deployment.md has the table): on
    all-MiniLM-L6-v2 it lost 0.16 STS-B dev and 0.14 of the seven-task average and ran ~2x fp32 ONNX on 2 cores.
    Static QDQ calibrated on the training text lost 1.7 / 3.5 and ran 0.9-1.3x fp32: one fixed range per activation
    tensor must cover every sentence (likely the few large-magnitude channels transformers have), where dynamic
    takes each batch's own range. QUInt8 weights were as accurate as QInt8 per-channel but ~1.1x fp32 only
    on this CPU (AVX512-VNNI multiplies u8 by s8).

    ``dynamic``: int8 weights (``weight_type`` qint8 or quint8) and per-batch activation scales.
    ``static``: QDQ int8 weights and activations of the MatMuls, activation ranges from ``sentences`` run through
    ``tokenize`` (MinMax); the rest of the graph (LayerNorm, softmax, GELU, pooling) stays fp32, as those
    quantise badly and cost little.
    """
    import tempfile

    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    types = {"qint8": QuantType.QInt8, "quint8": QuantType.QUInt8}
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sentcl-quant-") as tmp:
        # Shape inference + graph folding first, as ONNX Runtime's quantisation guide asks: it finds more
        # MatMuls to quantise and gives the calibrator named intermediate tensors. ONNX's shape inference only:
        # the symbolic one stops at the exporter's position slice (Min(512, sequence)).
        prepared = Path(tmp) / "prepared.onnx"
        quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
        if method == "dynamic":
            quantize_dynamic(
                str(prepared), str(target), per_channel=per_channel, weight_type=types[weight_type]
            )
        elif method == "static":
            if tokenize is None or not sentences:
                raise ValueError("static quantisation needs calibration sentences and their tokenizer")
            quantize_static(
                str(prepared),
                str(target),
                _calibration_reader(tokenize, sentences),
                quant_format=QuantFormat.QDQ,
                op_types_to_quantize=["MatMul"],
                per_channel=per_channel,
                activation_type=QuantType.QInt8,
                weight_type=QuantType.QInt8,
                extra_options={"ActivationSymmetric": True},
            )
        else:
            raise ValueError(f"unknown quantisation method {method!r}; choose dynamic or static")
    return target


def dev_drops(
    fp32: Mapping[str, Any], int8: Mapping[str, Any], keys: Sequence[str] = ("stsb_dev", "sick_dev")
) -> dict:
    """How far int8 falls below fp32 on each dev split both have (Spearman x 100; negative: int8 is higher)."""
    return {
        k: float(fp32[k]) - float(int8[k])
        for k in keys
        if fp32.get(k) is not None and int8.get(k) is not None
    }


def within_tolerance(drops: Mapping[str, float], max_drop: float) -> bool:
    """The shipping rule: some dev split was compared, and none dropped by more than ``max_drop``."""
    return bool(drops) and all(drop <= max_drop for drop in drops.values())
