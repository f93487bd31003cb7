"""Serve a registered encoder over HTTP, checked before it loads and before MLflow parses a request.

    python -m sentcl_mlflow.serve [models:/sentcl-encoder@champion] [--host 127.0.0.1] [--port 5001]

What ``mlflow models serve -m models:/...`` does, with two checks in front of it:

- the version is downloaded with :func:`sentcl_mlflow.registry.download_verified`: every file (weights,
  tokenizer, MLmodel, the serving code) must match the manifest recorded at registration, or nothing loads
  (one line, exit 2);
- a JSON request whose sentences are not all strings (``{"inputs": [123, null]}``) is answered 400 with a
  message naming the first bad item, before MLflow's parser would turn them into the text "123" and "None"
  (it coerces to the logged string signature);
- a CSV request is refused (400, as every input the model cannot take): CSV has no types, so nothing can tell the number 123 from the sentence
  "123", and pandas, which MLflow parses it with, drops blank lines and takes the first line as a header,
  so the answer would not line up with the lines sent. Parquet (typed) stays: MLflow refuses a column that
  is not text, and the model itself refuses a missing value (``pyfunc_checks.sentences``), whatever the
  content type.

The app is MLflow's own scoring server (``mlflow.pyfunc.scoring_server.init``): same routes, same answers.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

INPUT_KEYS = ("inputs", "instances", "dataframe_split", "dataframe_records")
CSV_REFUSED = (
    "text/csv is not accepted: CSV cannot tell a number from a sentence, and blank lines and the header "
    'line would be dropped from the answer; send JSON, {"inputs": ["a sentence", ...]}'
)


def _cells(payload: dict[str, Any]) -> list[Any] | None:
    """The sentences a JSON request carries, in order; None when its shape is not one of MLflow's."""
    for key in INPUT_KEYS:
        if key not in payload:
            continue
        value = payload[key]
        if key == "dataframe_split":
            rows = value.get("data", []) if isinstance(value, dict) else []
            return [cell for row in rows for cell in (row if isinstance(row, list) else [row])]
        if key == "dataframe_records":
            return [cell for rec in value if isinstance(rec, dict) for cell in rec.values()]
        if isinstance(value, dict):  # {"inputs": {"sentence": [...]}}
            value = next(iter(value.values()), [])
        if isinstance(value, str):
            return [value]
        if isinstance(value, list):
            return [
                v.get("sentence", next(iter(v.values()), None)) if isinstance(v, dict) else v for v in value
            ]
        return [value]
    return None


def input_problem(body: bytes) -> str | None:
    """A one-line reason to refuse a JSON scoring request, or None when every sentence is a string."""
    try:
        payload = json.loads(body or b"null")
    except ValueError:
        return None  # MLflow answers malformed JSON itself (400)
    if not isinstance(payload, dict):
        return None
    cells = _cells(payload)
    if cells is None:
        return None
    bad = [(i, v) for i, v in enumerate(cells) if not isinstance(v, str)]
    if not bad:
        return None
    i, v = bad[0]
    return (
        f"input {i} is {type(v).__name__} {v!r}, not a string: send a list of sentences "
        f"({len(bad)} of {len(cells)} inputs are not strings)"
    )


def build_app(model_dir: Path):  # noqa: ANN201 (a FastAPI app; fastapi is MLflow's dependency)
    import mlflow
    from fastapi import Request
    from fastapi.responses import JSONResponse
    from mlflow.pyfunc.scoring_server import init

    app = init(mlflow.pyfunc.load_model(str(model_dir)))

    @app.middleware("http")
    async def strings_only(request: Request, call_next):  # noqa: ANN001, ANN202
        if request.method == "POST" and request.url.path == "/invocations":
            content_type = request.headers.get("content-type", "")
            if content_type.split(";")[0].strip().lower() == "text/csv":
                return JSONResponse({"error_code": "BAD_REQUEST", "message": CSV_REFUSED}, status_code=400)
            if "json" in content_type:
                problem = input_problem(await request.body())
                if problem:
                    return JSONResponse(
                        {"error_code": "INVALID_PARAMETER_VALUE", "message": problem}, status_code=400
                    )
        return await call_next(request)

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve a registered encoder, checked (see the module).")
    parser.add_argument("model", nargs="?", default=None, help="models:/NAME@ALIAS or models:/NAME/VERSION")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5001)
    args = parser.parse_args(argv)
    import os

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one line on failure, no bars
    from sentcl_mlflow.registry import download as registry
    from sentcl_mlflow.store import TrackingAuthError, TrackingUnavailableError

    model = args.model or f"models:/{registry.gate_config().model_name}@{registry.CHAMPION}"
    if not model.startswith("models:/"):
        print(
            f"serve: {model}: give a registered model, models:/NAME@ALIAS or models:/NAME/VERSION",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory(prefix="sentcl-serve-") as scratch:
        try:
            root = registry.download_verified(model, Path(scratch))
        except (registry.WeightsMismatchError, TrackingAuthError) as e:
            print(f"serve: {e}", file=sys.stderr)
            return 2
        except TrackingUnavailableError as e:
            print(f"serve: {e}", file=sys.stderr)
            return 75
        import uvicorn

        print(f"serve: {model} verified against its registration manifest; http://{args.host}:{args.port}")
        uvicorn.run(build_app(root), host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
