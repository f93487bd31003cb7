"""What the served encoder does with sentences that are not strings, per content type, over real HTTP.

The model is sentcl_mlflow/pyfunc_encoder.py logged as the export stage logs it (models from code, pyfunc_checks.py
in its code/, a tiny encoder as its artifact), loaded by MLflow and served by uvicorn on a loopback port:
MLflow's own scoring app (what `mlflow models serve` runs) and the checked app of `python -m
sentcl_mlflow.serve`."""

from __future__ import annotations

import io
import json
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager

import pytest

from sentcl_mlflow.registration import PYFUNC_MODEL
from tests.paths import ROOT
from tests.services.test_registry import free_port

SENTENCES = ["a man is playing a guitar", "a dog is running"]
CSV, JSON, PARQUET = "text/csv", "application/json", "application/vnd.apache.parquet"


@pytest.fixture(scope="module")
def model_dir(tiny_model, tmp_path_factory):
    import mlflow
    import numpy as np
    from mlflow.models import infer_signature
    from sentence_transformers import SentenceTransformer

    expected = SentenceTransformer(str(tiny_model), device="cpu").encode(SENTENCES)
    folder = tmp_path_factory.mktemp("served") / "model"
    mlflow.pyfunc.save_model(  # runs.log_pyfunc_run's arguments, saved to a folder instead of a run
        str(folder),
        python_model=str(PYFUNC_MODEL),
        code_paths=[str(ROOT / "sentcl_mlflow" / "pyfunc_checks.py")],
        artifacts={"encoder": str(tiny_model)},
        signature=infer_signature(SENTENCES, np.asarray(expected, dtype=np.float32)),
        input_example=SENTENCES,
        pip_requirements=["mlflow"],
    )
    return folder, expected


@contextmanager
def serving(app):  # noqa: ANN001
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(10)


def post(port: int, body: bytes, content_type: str) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/invocations", data=body, headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def parquet(values: list) -> bytes:
    import pandas as pd

    out = io.BytesIO()
    pd.DataFrame({"sentence": values}).to_parquet(out)
    return out.getvalue()


def test_mlflow_alone_gets_a_missing_sentence_refused_by_the_model_whatever_the_content_type(model_dir):
    """`mlflow models serve`: the model's own check (predict) refuses a missing value in CSV, parquet and a
    JSON data frame with 400; only numbers in JSON reach it already turned into text (the checked app's job)."""
    import mlflow
    from mlflow.pyfunc.scoring_server import init

    folder, _ = model_dir
    with serving(init(mlflow.pyfunc.load_model(str(folder)))) as port:
        for body, content_type in (
            (b'sentence\n""\n123\n', CSV),  # the quoted empty cell is NaN to pandas
            (parquet(["a dog", None]), PARQUET),
            (json.dumps({"dataframe_split": {"columns": ["sentence"], "data": [["a dog"], [None]]}}), JSON),
        ):
            status, answer = post(port, body if isinstance(body, bytes) else body.encode(), content_type)
            assert status == 400, (content_type, answer)
            assert answer["error_code"] == "INVALID_PARAMETER_VALUE"
            assert "not a string: send a list of sentences" in answer["message"], answer
        # What only a check in front of MLflow's parser can refuse: typed JSON, coerced to "123" and "None".
        status, answer = post(port, json.dumps({"inputs": [123, None]}).encode(), JSON)
        assert status == 200 and len(answer["predictions"]) == 2
        # CSV has no types, and pandas drops a blank line: two lines sent, one vector back.
        status, answer = post(port, b"sentence\n\na dog\n", CSV)
        assert status == 200 and len(answer["predictions"]) == 1


def test_the_checked_server_refuses_csv_and_non_strings_and_serves_sentences(model_dir):
    import numpy as np

    from sentcl.params import read_params
    from sentcl_mlflow.serve import ServeLimits, build_app

    folder, expected = model_dir
    with serving(build_app(folder, ServeLimits.from_params(read_params()))) as port:
        for body in (b'sentence\n""\n123\n', b"sentence\n\na dog\n", b"a dog\na cat\n"):
            for content_type in (CSV, "text/csv; charset=utf-8"):
                status, answer = post(port, body, content_type)
                assert status == 400, (body, answer)
                assert (
                    answer["message"].startswith("text/csv is not accepted")
                    and "send JSON" in answer["message"]
                )
        status, answer = post(port, json.dumps({"inputs": [123, None]}).encode(), JSON)
        assert status == 400 and answer["message"].startswith("input 0 is int 123, not a string"), answer
        status, answer = post(port, parquet(["a dog", None]), PARQUET)
        assert status == 400 and "input 1 is" in answer["message"], answer
        status, answer = post(port, parquet([1, 2]), PARQUET)  # MLflow's schema check: not text
        assert status == 400, answer
        # Sentences are served, by JSON and parquet, with the encoder's own vectors.
        status, answer = post(port, json.dumps({"inputs": SENTENCES}).encode(), JSON)
        assert status == 200, answer
        np.testing.assert_allclose(answer["predictions"], expected, atol=1e-5)
        status, answer = post(port, parquet(SENTENCES), PARQUET)
        assert status == 200, answer
        np.testing.assert_allclose(answer["predictions"], expected, atol=1e-5)
