"""The MLflow pyfunc that serves the encoder: sentences in, one vector per sentence out.

Logged as "models from code" (MLflow copies this file into the model), so a loaded model needs only
sentence-transformers, not this repository, and nothing is pickled. The sentence-transformers folder travels
as the artifact ``encoder``; vectors equal ``SentenceTransformer(folder).encode`` (mean pooling, no
normalisation), which is what the exported folder gives.
"""

from __future__ import annotations

from typing import Any

import mlflow
import numpy as np


def _sentences(model_input: Any) -> list[str]:
    """``mlflow models serve`` hands a DataFrame; ``predict`` in Python may get a list, an array or one string.

    Every item that reaches the model must be a string: ``predict([123, None])`` is refused with an
    INVALID_PARAMETER_VALUE error (HTTP 400), never turned into the vectors of "123" and "None". Known gap:
    ``mlflow models serve`` parses a request against the logged string signature before the model sees it
    (``infer_and_parse_data`` turns ``[123, null]`` into strings), so over HTTP this check does not fire yet."""
    if isinstance(model_input, str):
        return [model_input]
    if hasattr(model_input, "iloc") and hasattr(model_input, "columns"):  # pandas without importing it
        column = "sentence" if "sentence" in model_input.columns else model_input.columns[0]
        values = model_input[column].tolist()
    elif isinstance(model_input, dict):
        values = model_input.get("sentence", next(iter(model_input.values())))
        values = [values] if isinstance(values, str) else list(values)
    else:
        values = np.asarray(model_input, dtype=object).reshape(-1).tolist()
    bad = [(i, v) for i, v in enumerate(values) if not isinstance(v, str)]
    if bad:
        from mlflow.exceptions import INVALID_PARAMETER_VALUE, MlflowException

        i, v = bad[0]
        raise MlflowException(
            f"input {i} is {type(v).__name__} {v!r}, not a string: send a list of sentences "
            f"({len(bad)} of {len(values)} inputs are not strings)",
            error_code=INVALID_PARAMETER_VALUE,
        )
    return values


class SentenceEncoderModel(mlflow.pyfunc.PythonModel):
    # MLflow 3 checks `predict` for type hints when the class is created and, finding none, prints "Add type hints
    # to the `predict` method" in a way no warning filter reaches. It has none on purpose (below); this is
    # MLflow's own switch for a model that opts out of type-hint validation.
    _skip_type_hint_validation = True

    def load_context(self, context: Any) -> None:
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(context.artifacts["encoder"])

    # No type hints here on purpose: MLflow 3 reads them as an input schema and would coerce the DataFrame that
    # `mlflow models serve` passes; the explicit signature logged with the model is the schema.
    def predict(self, context, model_input, params=None):  # noqa: ANN001, ANN201
        batch_size = int((params or {}).get("batch_size", 64))
        sentences = _sentences(model_input)
        return np.asarray(
            self.model.encode(sentences, batch_size=batch_size, convert_to_numpy=True), dtype=np.float32
        )


mlflow.models.set_model(SentenceEncoderModel())
