"""The pooling a model folder carries: ``sentcl_pooling.json`` next to the weights.

sentence-transformers' ``1_Pooling/config.json`` can say cls or mean, but not "the state at the [MASK] of a
template, minus the template's delta" (PromptBERT). A folder saved with any other pooling than mean/cls writes
this file, and every consumer (evaluate, export, ONNX, the MLflow pyfunc, embed) reads it through
``read_model_pooling``. A folder without it says nothing: the consumer's own default applies (params.yaml
``evaluate.pooling``), which keeps every existing folder scored as before.

No torch import here: stages that only need to know the pooling stay cheap to start.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

POOLING_FILE = "sentcl_pooling.json"
POOLINGS = ("cls", "last-avg", "last2-avg", "first-last-avg", "prompt")
SLOT, MASK = "[X]", "[MASK]"


def check_template(template: str) -> tuple[str, str]:
    """(text before the slot, text after it); a template needs exactly one ``[X]`` and one ``[MASK]``."""
    if not isinstance(template, str) or template.count(SLOT) != 1 or template.count(MASK) != 1:
        raise ValueError(f"prompt template {template!r} needs exactly one {SLOT} and one {MASK}")
    before, after = template.split(SLOT)
    return before, after


@dataclass(frozen=True)
class PromptSettings:
    """How a model is pooled with a prompt: the template, whether the template's delta is subtracted
    (denoising), and whether " ." ends a sentence that has no final punctuation (the authors' evaluation.py)."""

    template: str
    denoise: bool = False
    add_period: bool = False

    def __post_init__(self) -> None:
        check_template(self.template)


@dataclass(frozen=True)
class ModelPooling:
    pooling: str
    prompt: PromptSettings | None = None

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {self.pooling!r}; choose one of {', '.join(POOLINGS)}")
        if self.pooling == "prompt" and self.prompt is None:
            raise ValueError("pooling 'prompt' needs prompt settings (template, denoise)")

    def to_json(self) -> dict:
        out: dict = {"pooling": self.pooling}
        if self.prompt is not None:
            out["prompt"] = asdict(self.prompt)
        return out


def read_model_pooling(folder: str | Path) -> ModelPooling | None:
    """The pooling ``folder`` was saved with, or None when it does not say (then use your default).
    A malformed file is an error naming the file, not a silent fallback to mean pooling."""
    path = Path(folder) / POOLING_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        unknown = set(data) - {"pooling", "prompt"}
        if unknown:
            raise ValueError(f"unknown keys {sorted(unknown)}")
        prompt = data.get("prompt")
        if prompt is not None:
            extra = set(prompt) - {"template", "denoise", "add_period"}
            if extra:
                raise ValueError(f"unknown prompt keys {sorted(extra)}")
            prompt = PromptSettings(**prompt)
        return ModelPooling(data["pooling"], prompt)
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: {error}") from error


def write_model_pooling(folder: str | Path, pooling: ModelPooling) -> Path:
    path = Path(folder) / POOLING_FILE
    path.write_text(json.dumps(pooling.to_json(), indent=2) + "\n")
    return path
