"""Serve a registered encoder over HTTP, checked before it loads, bounded for every request.

    python -m sentcl_mlflow.serve [models:/sentcl-encoder@champion] [--host 127.0.0.1] [--port 5001] [--params FILE]

What ``mlflow models serve -m models:/...`` does, with checks in front of it and limits around it:

- the version is downloaded with :func:`sentcl_mlflow.registry.download.download_verified`: every file (weights,
  tokenizer, MLmodel, the serving code) must match the manifest recorded at registration, or nothing loads
  (one line, exit 2);
- a request is bounded by params.yaml ``serve:`` (:class:`ServeLimits`): a body over ``max_body_bytes`` is
  answered 413 before it is read (a declared length at once, a chunked body as soon as it passes the limit),
  more than ``max_sentences`` sentences or one longer than ``max_sentence_chars`` characters 400; each answer
  is one line of JSON (``{"error_code": ..., "message": ...}``);
- a JSON request whose sentences are not all strings (``{"inputs": [123, null]}``) is answered 400 with a
  message naming the first bad item, where MLflow's parser would turn them into the text "123" and "None"
  (it coerces to the logged string signature);
- every other malformed JSON body is answered 400 in one line too, before the model sees it: empty, not
  UTF-8 or not JSON, nested deeper than ``MAX_JSON_DEPTH`` (counted before ``json.loads``, whose recursion
  would otherwise exhaust Python's stack), not exactly one of MLflow's shapes with one column of sentences
  (so the answer has one row per row sent), or a sentence that is not valid Unicode (a lone surrogate);
  another content type is 415;
- a CSV request is refused (400, as every input the model cannot take): CSV has no types, so nothing can tell
  the number 123 from the sentence "123", and pandas, which MLflow parses it with, drops blank lines and takes
  the first line as a header, so the answer would not line up with the lines sent. Parquet (typed) stays:
  a column that is not text is refused, and the model itself refuses a missing value
  (``pyfunc_checks.sentences``);
- the sentences are encoded a batch at a time in one worker thread; a request not answered within
  ``request_timeout_s`` gets 504 and its remaining batches are dropped (the work stops after the batch in hand,
  rather than running on unseen), and TERM stops the server within ``shutdown_s`` (in-flight requests are
  cancelled the same way).

The rest of the app is MLflow's own scoring server (``mlflow.pyfunc.scoring_server.init``: ``/ping``,
``/health``, ``/version``); ``/invocations`` answers as it does (``{"predictions": [[...], ...]}``).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import re
import reprlib
import sys
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from sentcl.params import read_section, real_number, whole_number

INPUT_KEYS = ("inputs", "instances", "dataframe_split", "dataframe_records")
SHAPE = '{"inputs": ["a sentence", ...]} (or instances, dataframe_split, dataframe_records)'
# The deepest JSON a request may nest: dataframe_split with params needs 4; json.loads recurses once per level
# and would run out of Python's stack (RecursionError) near 1,000, wherever the server's stack then stands.
MAX_JSON_DEPTH = 32
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string literal, escapes included
_OPENERS, _CLOSERS = list(b"[{"), list(b"]}")  # their byte values
CSV_REFUSED = (
    "text/csv is not accepted: CSV cannot tell a number from a sentence, and blank lines and the header "
    'line would be dropped from the answer; send JSON, {"inputs": ["a sentence", ...]}'
)


@dataclass(frozen=True)
class ServeLimits:
    """params.yaml ``serve:``: what one request may ask of the served model, and how long it may take."""

    max_body_bytes: int
    max_sentences: int
    max_sentence_chars: int
    request_timeout_s: float
    shutdown_s: float

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> ServeLimits:
        names = [f.name for f in fields(cls)]
        raw = read_section(params, "serve", names)
        for name in ("max_body_bytes", "max_sentences", "max_sentence_chars"):
            whole_number(raw[name], f"serve.{name}", minimum=1)
        for name in ("request_timeout_s", "shutdown_s"):
            real_number(raw[name], f"serve.{name}", above=0)
        return cls(**raw)


class Refusal(Exception):
    """A request answered with ``status`` and one line (``code``, ``message``) before the model sees it."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class BadShape(Exception):
    """The JSON is not one of the request shapes MLflow's scoring server reads (the message says which part)."""


def _depth(body: bytes) -> int:
    """How deeply ``body`` nests arrays and objects, if it is JSON, counted without parsing it (strings, which may
    hold brackets, removed first), so that ``json.loads`` never recurses past Python's stack."""
    if body.count(b"[") + body.count(b"{") <= MAX_JSON_DEPTH:
        return 0  # too few brackets to nest too deeply: the common case costs two counts
    import numpy as np

    outside = np.frombuffer(_JSON_STRING.sub(b'""', body), dtype=np.uint8)
    steps = np.isin(outside, _OPENERS).astype(np.int32) - np.isin(outside, _CLOSERS).astype(np.int32)
    return int(np.cumsum(steps).max(initial=0))


def _column(value: Any, where: str) -> list[Any]:
    """The cells of one column: a string is one sentence, a list its sentences (a record ``{"sentence": ...}``
    per item allowed); anything else is not a column of sentences."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise BadShape(f"{where} must be a list of sentences, not {type(value).__name__}")
    cells = []
    for v in value:
        if isinstance(v, dict):
            if len(v) != 1:
                raise BadShape(f"{where}: a record must have one field (the sentence), not {len(v)}")
            v = next(iter(v.values()))
        cells.append(v)
    return cells


def _cells(payload: dict[str, Any]) -> list[Any]:
    """The sentences a JSON request carries, in order, one per row of the answer; :class:`BadShape` when the
    payload is not exactly one of MLflow's shapes (one key of INPUT_KEYS, optional ``params``) with one column."""
    keys = [key for key in INPUT_KEYS if key in payload]
    extra = sorted(set(payload) - set(INPUT_KEYS) - {"params"})
    if len(keys) != 1 or extra:
        found = ", ".join(keys + extra) or "no key"
        raise BadShape(f"expected one of {', '.join(INPUT_KEYS)} (and params), found {found}")
    key = keys[0]
    value = payload[key]
    if key == "dataframe_split":
        rows = value.get("data") if isinstance(value, dict) else None
        if not isinstance(rows, list):
            raise BadShape('dataframe_split must be {"columns": ["sentence"], "data": [["a sentence"], ...]}')
        if any(isinstance(row, list) and len(row) != 1 for row in rows):
            raise BadShape("dataframe_split: each row of data must hold one cell (the sentence)")
        return [row[0] if isinstance(row, list) else row for row in rows]
    if key == "dataframe_records":
        if not isinstance(value, list) or not all(isinstance(rec, dict) and len(rec) == 1 for rec in value):
            raise BadShape('dataframe_records must be a list of one-field records, [{"sentence": ...}, ...]')
        return [next(iter(rec.values())) for rec in value]
    if isinstance(value, dict):  # {"inputs": {"sentence": [...]}}: one column
        if len(value) != 1:
            raise BadShape(f"{key} as columns must have one column (the sentences), not {len(value)}")
        return _column(next(iter(value.values())), key)
    if isinstance(value, list) and any(isinstance(v, list) for v in value):
        raise BadShape(f"{key} must be a flat list of sentences, not a list of lists")
    return _column(value, key)


def _not_strings(cells: list[Any]) -> str | None:
    bad = [(i, v) for i, v in enumerate(cells) if not isinstance(v, str)]
    if not bad:
        return None
    i, v = bad[0]
    return (
        f"input {i} is {type(v).__name__} {_short(v)}, not a string: send a list of sentences "
        f"({len(bad)} of {len(cells)} inputs are not strings)"
    )


def _short(value: Any) -> str:
    """``repr(value)``, at most 60 characters of it: a refusal names the item, it does not echo the body."""
    text = reprlib.repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _not_text(cells: list[str]) -> str | None:
    """The first sentence that is not valid Unicode (a lone surrogate, ``"\\ud800"`` in JSON), which no encoder
    can read and UTF-8 cannot carry."""
    for i, cell in enumerate(cells):
        try:
            cell.encode("utf-8")
        except UnicodeEncodeError as e:
            return f"input {i} is not valid Unicode text ({cell[e.start]!a} at character {e.start})"
    return None


def parse_request(body: bytes, content_type: str, limits: ServeLimits) -> tuple[list[str], dict[str, Any]]:
    """(sentences, params) of a scoring request, or :class:`Refusal`: the shapes MLflow's scoring server reads
    (JSON ``inputs``, ``instances``, ``dataframe_split``, ``dataframe_records``; parquet), every sentence a string,
    within the limits."""
    mime = content_type.split(";")[0].strip().lower()
    params: dict[str, Any] = {}
    if mime == "text/csv":
        raise Refusal(400, "BAD_REQUEST", CSV_REFUSED)
    if mime == "application/json":
        if not body.strip():
            raise Refusal(400, "MALFORMED_REQUEST", 'the body is empty: send {"inputs": ["a sentence", ...]}')
        depth = _depth(body)
        if depth > MAX_JSON_DEPTH:  # refused before json.loads, whose recursion would run out of stack
            raise Refusal(
                400, "MALFORMED_REQUEST", f"the body nests {depth} levels deep; at most {MAX_JSON_DEPTH}"
            )
        try:
            payload = json.loads(body)
        except ValueError as e:  # not JSON, or not UTF-8 (UnicodeDecodeError is a ValueError)
            raise Refusal(400, "MALFORMED_REQUEST", f"the body is not JSON ({e})") from None
        except RecursionError:  # unreachable after the depth check; kept so that it can never be a 500
            raise Refusal(400, "MALFORMED_REQUEST", "the body is JSON nested too deeply to read") from None
        if not isinstance(payload, dict):
            raise Refusal(400, "BAD_REQUEST", f"send {SHAPE}, not a JSON {type(payload).__name__}")
        try:
            cells = _cells(payload)
        except BadShape as e:
            raise Refusal(400, "BAD_REQUEST", f"{e}: send {SHAPE}") from None
        params = payload.get("params") or {}
        if not isinstance(params, dict):
            raise Refusal(400, "INVALID_PARAMETER_VALUE", "params must be an object")
    elif mime in ("application/vnd.apache.parquet", "application/octet-stream"):
        import pandas as pd

        try:
            frame = pd.read_parquet(io.BytesIO(body))
        except Exception as e:  # noqa: BLE001 (whatever pyarrow says about bytes that are not parquet)
            raise Refusal(400, "MALFORMED_REQUEST", f"the body is not parquet ({type(e).__name__})") from None
        column = "sentence" if "sentence" in frame.columns else frame.columns[0]
        cells = [None if v is None or v != v else v for v in frame[column].tolist()]  # NaN: missing
    else:
        raise Refusal(415, "BAD_REQUEST", f"content type {mime or 'none'} is not accepted: send JSON")
    problem = _not_strings(cells) or _not_text(cells)
    if problem:
        raise Refusal(400, "INVALID_PARAMETER_VALUE", problem)
    if len(cells) > limits.max_sentences:
        raise Refusal(
            400,
            "INVALID_PARAMETER_VALUE",
            f"{len(cells)} sentences in one request; at most {limits.max_sentences} (serve.max_sentences)",
        )
    for i, cell in enumerate(cells):
        if len(cell) > limits.max_sentence_chars:
            raise Refusal(
                400,
                "INVALID_PARAMETER_VALUE",
                f"input {i} has {len(cell)} characters; at most {limits.max_sentence_chars} "
                "(serve.max_sentence_chars)",
            )
    batch = params.get("batch_size", 64)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise Refusal(
            400,
            "INVALID_PARAMETER_VALUE",
            f"params.batch_size must be a whole number >= 1, not {_short(batch)}",
        )
    return cells, params


class Cancelled(Exception):
    """The request's time ran out (or the server is stopping): its remaining batches are not encoded."""


class Encoder:
    """The loaded model, run one batch at a time in one worker thread. Each request has its own cancel flag,
    checked between batches: a request that timed out, or a server that stops, drops the rest of its work."""

    def __init__(self, model: Any) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.model = model
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="encode")
        self.stopping = threading.Event()

    def _encode(self, sentences: list[str], params: dict[str, Any], cancel: threading.Event) -> list:
        import numpy as np

        step = int(params.get("batch_size", 64))
        parts = []
        for start in range(0, len(sentences), step):
            if cancel.is_set() or self.stopping.is_set():
                raise Cancelled()
            vectors = self.model.predict(sentences[start : start + step], params=params or None)
            parts.append(np.asarray(vectors, dtype=np.float32))
        return np.concatenate(parts).tolist() if parts else []

    async def encode(self, sentences: list[str], params: dict[str, Any], timeout_s: float) -> list:
        cancel = threading.Event()
        job = asyncio.get_running_loop().run_in_executor(self.pool, self._encode, sentences, params, cancel)
        try:
            return await asyncio.wait_for(job, timeout_s)
        except BaseException:  # timed out, or the server cancelled the request (TERM): no more batches
            cancel.set()
            raise

    def stop(self) -> None:
        self.stopping.set()
        self.pool.shutdown(wait=False, cancel_futures=True)


async def _body(request: Any, limit: int) -> bytes:
    """The request's body, read only up to ``limit`` bytes: a declared length over it is refused at once."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise Refusal(
            413, "REQUEST_TOO_LARGE", f"the body has {declared} bytes; at most {limit} (serve.max_body_bytes)"
        )
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise Refusal(413, "REQUEST_TOO_LARGE", f"the body is over {limit} bytes (serve.max_body_bytes)")
    return bytes(body)


def build_app(model_dir: Path, limits: ServeLimits):  # noqa: ANN201 (a FastAPI app)
    """MLflow's scoring app on the model in ``model_dir``, its ``/invocations`` answered here (see the module)
    within ``limits`` (params.yaml ``serve:``, as the entry point read it)."""
    import mlflow
    from fastapi import Request
    from fastapi.responses import JSONResponse
    from mlflow.exceptions import MlflowException
    from mlflow.pyfunc.scoring_server import init

    model = mlflow.pyfunc.load_model(str(model_dir))
    app = init(model)
    encoder = app.state.encoder = Encoder(model)

    def refused(status: int, code: str, message: str) -> JSONResponse:
        headers = {"Connection": "close"} if status == 413 else None  # the rest of the body is not read
        # One line, and one that UTF-8 can carry whatever text a message quotes (a lone surrogate included).
        line = (message.splitlines() or [""])[0][:500].encode("utf-8", "backslashreplace").decode("utf-8")
        return JSONResponse({"error_code": code, "message": line}, status_code=status, headers=headers)

    @app.middleware("http")
    async def bounded(request: Request, call_next):  # noqa: ANN001, ANN202
        if not (request.method == "POST" and request.url.path == "/invocations"):
            return await call_next(request)
        try:
            body = await _body(request, limits.max_body_bytes)
            sentences, params = parse_request(body, request.headers.get("content-type", ""), limits)
            vectors = await encoder.encode(sentences, params, limits.request_timeout_s)
            return JSONResponse(
                {"predictions": vectors}
            )  # rendered here: a NaN vector is a 500 in one line too
        except Refusal as e:
            return refused(e.status, e.code, e.message)
        except (TimeoutError, Cancelled):
            return refused(
                504,
                "DEADLINE_EXCEEDED",
                f"not answered within {limits.request_timeout_s:g}s (serve.request_timeout_s); its work was dropped",
            )
        except MlflowException as e:  # the model's own refusal (a missing sentence, a bad backend)
            return refused(e.get_http_status_code(), str(e.error_code), e.message)
        except Exception as e:  # anything else: still one line of JSON, never a plain-text traceback
            return refused(500, "INTERNAL_ERROR", f"{type(e).__name__}: {e}")

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve a registered encoder, checked (see the module).")
    parser.add_argument("model", nargs="?", default=None, help="models:/NAME@ALIAS or models:/NAME/VERSION")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5001)
    parser.add_argument(
        "--params", type=Path, help="params.yaml whose serve: limits apply (default: the checkout's)"
    )
    args = parser.parse_args(argv)
    import os

    from sentcl.params import ParamsError, read_params
    from sentcl.registry.rules import GateConfig
    from sentcl_mlflow.store import TrackingConfig

    try:
        params = read_params(args.params)
        limits, production = ServeLimits.from_params(params), GateConfig.from_params(params).model_name
        tracking = TrackingConfig.from_params(params)
    except ParamsError as e:
        print(f"serve: {e}", file=sys.stderr)
        return 2

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one line on failure, no bars
    from sentcl_mlflow.registry import download as registry
    from sentcl_mlflow.store import TrackingAuthError, TrackingUnavailableError, bound_requests

    model = args.model or f"models:/{production}@{registry.CHAMPION}"
    if not model.startswith("models:/"):
        print(
            f"serve: {model}: give a registered model, models:/NAME@ALIAS or models:/NAME/VERSION",
            file=sys.stderr,
        )
        return 2
    bound_requests(tracking)
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

        app = build_app(root, limits)
        print(
            f"serve: {model} verified against its registration manifest; http://{args.host}:{args.port}",
            flush=True,
        )
        # TERM: no new connection; requests in flight get shutdown_s, then they are cancelled (and with them
        # the batches still to encode), and the process exits.
        config = uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level="warning",
            timeout_graceful_shutdown=limits.shutdown_s,
        )
        try:
            uvicorn.Server(config).run()
        finally:
            app.state.encoder.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
