"""`python -m sentcl_mlflow.serve` against a hostile client, over real HTTP on 127.0.0.1: the real CLI in its own
process, serving a tiny encoder logged and registered the export stage's way in the session's scratch store, with
params.yaml's ``serve:`` limits (a copy of params.yaml per server). Every loop is bounded. Marked slow."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from sentcl.params import read_params
from tests.paths import ROOT
from tests.services.test_pyfunc_manifest import SENTENCES, register_tiny_pyfunc
from tests.services.test_registry import free_port

# Slow (`make test-all`): a registration, two servers of their own and tens of seconds of waiting on purpose.
pytestmark = pytest.mark.slow

LIMITS = {"max_body_bytes": 1 << 20, "max_sentences": 64, "max_sentence_chars": 200}
GROWTH_BOUND = 64 << 20  # what a 50 MB body may add to the server's peak memory (VmHWM): 64 MiB


@pytest.fixture(scope="module")
def model_uri(tiny_model):
    return register_tiny_pyfunc(tiny_model, "serve-limits")[0]


def start_server(model_uri: str, tmp_path: Path, **serve: float) -> tuple[subprocess.Popen, int]:
    """The CLI on a free loopback port, with params.yaml's ``serve:`` section changed by ``serve``."""
    params = dict(read_params())  # a read-only mapping: the changed copy is this test's
    params["serve"] = {**params["serve"], **serve}
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(params))
    port = free_port()
    log = tmp_path / f"serve-{port}.log"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sentcl_mlflow.serve",
            model_uri,
            "--port",
            str(port),
            "--params",
            str(params_file),
        ],
        cwd=ROOT,
        env=dict(os.environ),
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2):
                return process, port
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"the server did not start: {log.read_text()[-3000:]}")
            time.sleep(0.3)


def post(port: int, payload: dict | bytes, timeout: float = 60) -> tuple[int, dict]:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/invocations", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def peak_memory(pid: int) -> int:
    """VmHWM: the most resident memory the process has had, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@pytest.fixture(scope="module")
def server(model_uri, tmp_path_factory):
    process, port = start_server(model_uri, tmp_path_factory.mktemp("serve"), **LIMITS)
    yield {"process": process, "port": port}
    stop(process)


def one_line(answer: dict) -> str:
    assert set(answer) == {"error_code", "message"}, answer
    assert "\n" not in answer["message"], answer
    return answer["message"]


def test_a_body_over_the_limit_is_413_and_too_many_or_too_long_sentences_400_each_in_one_line(server):
    port = server["port"]
    # ~1.6 MB declared: answered at once and the connection closed (sent from a thread, so that the client's
    # write does not fail first with a broken pipe)
    status, message = _send_unread(port, 1_600_000, chunked=False)
    assert status == 413 and "at most 1048576 (serve.max_body_bytes)" in message, message
    status, answer = post(port, {"inputs": ["a dog"] * (LIMITS["max_sentences"] + 1)})
    assert status == 400 and "65 sentences in one request; at most 64" in one_line(answer), answer
    status, answer = post(port, {"inputs": ["a dog", "a" * (LIMITS["max_sentence_chars"] + 1)]})
    assert status == 400 and "input 1 has 201 characters; at most 200" in one_line(answer), answer
    status, answer = post(port, {"inputs": SENTENCES, "params": {"batch_size": 0}})
    assert status == 400 and "batch_size" in one_line(answer), answer
    # Within the limits: served.
    status, answer = post(port, {"inputs": ["a dog"] * LIMITS["max_sentences"], "params": {"batch_size": 7}})
    assert status == 200 and len(answer["predictions"]) == LIMITS["max_sentences"], answer


JSON, MAX_CHARS = "application/json", LIMITS["max_sentence_chars"]
# (body, content type, status, what the one line says). Each was answered otherwise before issue 58: the
# dataframe shapes with a 500 (TypeError), the wrong shapes served as if they were right (200), the nested
# bodies with a message that does not say so (or echoes the body), the empty ones as a wrong shape.
MALFORMED = {
    "nested-100000-arrays": (
        b"[" * 100_000 + b"]" * 100_000,
        JSON,
        400,
        "nests 100000 levels deep; at most 32",
    ),
    "nested-unclosed": (b'{"inputs": [' * 50_000, JSON, 400, "nests 100000 levels deep; at most 32"),
    "nested-500-in-inputs": (
        b'{"inputs": ' + b"[" * 500 + b'"a"' + b"]" * 500 + b"}",
        JSON,
        400,
        "nests 501",
    ),
    "nested-in-params": (
        b'{"inputs": ["a"], "params": {"x": ' + b'{"y": ' * 40 + b"1" + b"}" * 40 + b"}}",
        JSON,
        400,
        "nests 42 levels deep",
    ),
    "brackets-in-a-sentence-are-not-nesting": (
        json.dumps({"inputs": ["[" * 40 + '"{' * 40]}).encode(),
        JSON,
        200,
        None,
    ),
    "empty": (b"", JSON, 400, "the body is empty"),
    "blank": (b" \r\n ", JSON, 400, "the body is empty"),
    "not-utf8": (b'{"inputs": ["\xff\xfe"]}', JSON, 400, "not JSON ('utf-8' codec can't decode byte 0xff"),
    "not-json": (b"a dog runs in the park", JSON, 400, "the body is not JSON (Expecting value"),
    "trailing-bytes": (b'{"inputs": ["a dog"]} x', JSON, 400, "the body is not JSON (Extra data"),
    "huge-number": (
        b'{"inputs": [1' + b"0" * 5000 + b"]}",
        JSON,
        400,
        "the body is not JSON (Exceeds the limit",
    ),
    "top-level-list": (b'["a dog"]', JSON, 400, "not a JSON list"),
    "top-level-null": (b"null", JSON, 400, "not a JSON NoneType"),
    "no-input-key": (b'{"sentences": ["a dog"]}', JSON, 400, "found sentences"),
    "two-input-keys": (b'{"inputs": ["a"], "instances": ["b"]}', JSON, 400, "found inputs, instances"),
    "dict-instead-of-list": (
        b'{"inputs": {"sentence": 1}}',
        JSON,
        400,
        "must be a list of sentences, not int",
    ),
    "two-columns": (b'{"inputs": {"a": ["x"], "b": ["y"]}}', JSON, 400, "must have one column"),
    "numbers": (b'{"inputs": [1, 2]}', JSON, 400, "input 0 is int 1, not a string"),
    "nested-lists": (
        b'{"inputs": [["a"], ["b"]]}',
        JSON,
        400,
        "a flat list of sentences, not a list of lists",
    ),
    "record-of-two-fields": (b'{"inputs": [{"a": "x", "b": "y"}]}', JSON, 400, "one field"),
    "dataframe-split-data-not-a-list": (
        b'{"dataframe_split": {"data": 5}}',
        JSON,
        400,
        "dataframe_split must be",
    ),
    "dataframe-split-row-of-two": (b'{"dataframe_split": {"data": [["a", "b"]]}}', JSON, 400, "one cell"),
    "dataframe-records-not-a-list": (b'{"dataframe_records": 5}', JSON, 400, "dataframe_records must be"),
    "dataframe-records-not-records": (
        b'{"dataframe_records": [1, 2]}',
        JSON,
        400,
        "dataframe_records must be",
    ),
    "nan": (b'{"inputs": ["a", NaN]}', JSON, 400, "input 1 is float nan, not a string"),
    "infinite-batch-size": (
        b'{"inputs": ["a"], "params": {"batch_size": Infinity}}',
        JSON,
        400,
        "batch_size",
    ),
    "params-not-an-object": (b'{"inputs": ["a"], "params": [1]}', JSON, 400, "params must be an object"),
    "lone-surrogate": (b'{"inputs": ["a", "\\ud800"]}', JSON, 400, "input 1 is not valid Unicode text"),
    "sentence-past-the-limit": (
        json.dumps({"inputs": ["a" * (MAX_CHARS + 1)]}).encode(),
        JSON,
        400,
        f"input 0 has {MAX_CHARS + 1} characters",
    ),
    "no-content-type": (b'{"inputs": ["a"]}', None, 415, "content type none is not accepted"),
    "text-plain": (b'{"inputs": ["a"]}', "text/plain", 415, "content type text/plain is not accepted"),
    "form": (b"inputs=a", "application/x-www-form-urlencoded", 415, "is not accepted: send JSON"),
    "csv": (b"sentence\na dog\n", "text/csv", 400, "text/csv is not accepted"),
    "not-parquet": (b"PAR1 not parquet", "application/vnd.apache.parquet", 400, "the body is not parquet"),
}


def post_raw(port: int, body: bytes, content_type: str | None) -> tuple[int, str, bytes]:
    """(status, content type, the body's bytes) of one POST to /invocations, nothing parsed."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        headers = {"Content-Type": content_type} if content_type else {}
        connection.request("POST", "/invocations", body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.getheader("Content-Type", ""), response.read()
    finally:
        connection.close()


@pytest.mark.parametrize("case", list(MALFORMED))
def test_each_malformed_body_gets_a_4xx_and_one_short_line_of_json(server, case):
    """Issue 58: whatever is wrong with a body, the answer is a 4xx and one line of JSON that says what, never a
    500 or plain text; the sentence of brackets and quotes is served (brackets in strings are not nesting)."""
    body, content_type, expected, says = MALFORMED[case]
    status, answer_type, raw = post_raw(server["port"], body, content_type)
    assert status == expected, (case, status, raw[:300])
    assert answer_type == "application/json", (case, answer_type, raw[:300])
    if says is None:
        assert len(json.loads(raw)["predictions"]) == 1
        return
    assert b"\n" not in raw.strip(), raw[:300]
    message = one_line(json.loads(raw))
    assert says in message and len(message) < 300, (case, message[:300])


def test_the_server_still_serves_after_the_malformed_bodies(server):
    status, answer = post(server["port"], {"inputs": SENTENCES})
    assert status == 200 and len(answer["predictions"]) == len(SENTENCES), answer


def _send_unread(port: int, length: int, chunked: bool) -> tuple[int, str]:
    """A request declaring (or, chunked, streaming) ``length`` bytes of JSON, sent from a thread while the answer
    is read; the server may close before the rest is sent. (status, message)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.putrequest("POST", "/invocations")
    connection.putheader("Content-Type", "application/json")
    if chunked:
        connection.putheader("Transfer-Encoding", "chunked")
    else:
        connection.putheader("Content-Length", str(length))
    connection.endheaders()
    block = b"a" * (1 << 20)

    def send() -> None:
        try:
            connection.sock.sendall(b'{"inputs": ["' if not chunked else b'd\r\n{"inputs": ["\r\n')
            for _ in range(length // len(block)):
                connection.sock.sendall(block if not chunked else b"100000\r\n" + block + b"\r\n")
        except OSError:
            pass  # the server answered and closed: the rest is not wanted

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    response = connection.getresponse()
    status, answer = response.status, json.loads(response.read())
    sender.join(60)
    connection.close()
    return status, one_line(answer)


def test_a_50_mb_body_is_413_and_the_server_stays_under_its_memory_bound(server):
    """The body is refused before it is read: the server's peak resident memory grows by less than 64 MiB while
    a client sends 50 MB, declared or chunked; it serves the next request as before."""
    port, pid = server["port"], server["process"].pid
    assert post(port, {"inputs": SENTENCES})[0] == 200
    before = peak_memory(pid)
    for chunked in (False, True):
        status, message = _send_unread(port, 50 << 20, chunked)
        assert status == 413 and "serve.max_body_bytes" in message, message
    assert peak_memory(pid) - before < GROWTH_BOUND, (before, peak_memory(pid))
    assert post(port, {"inputs": SENTENCES})[0] == 200


def test_200_concurrent_well_formed_requests_all_succeed(server):
    port = server["port"]
    results: list[int] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        status, answer = post(port, {"inputs": [f"sentence number {i}", "a dog runs"]}, timeout=120)
        with lock:
            results.append(status if status != 200 or len(answer["predictions"]) == 2 else -1)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(200)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    assert len(results) == 200 and set(results) == {200}, sorted(set(results))


def test_a_timed_out_request_is_504_its_work_dropped_and_term_stops_the_server_in_seconds(
    model_uri, tmp_path
):
    """A request of 20,000 sentences a batch of one at a time (tens of seconds of work) against a 1 s limit: 504
    in one line, and the server's CPU goes quiet within a second (the batches left are dropped). Then one such
    request in flight and TERM: the server exits within its shutdown_s (2 s) and a few seconds of margin."""
    process, port = start_server(
        model_uri,
        tmp_path,
        max_body_bytes=4 << 20,
        max_sentences=20_000,
        request_timeout_s=1,
        shutdown_s=2,
    )
    try:
        heavy = {"inputs": ["a dog runs in the park"] * 20_000, "params": {"batch_size": 1}}
        started = time.monotonic()
        status, answer = post(port, heavy)
        assert status == 504 and "its work was dropped" in one_line(answer), answer
        assert time.monotonic() - started < 10
        time.sleep(1.0)  # the batch in hand ends
        busy = cpu_seconds(process.pid)
        time.sleep(3.0)
        assert cpu_seconds(process.pid) - busy < 0.5, "the timed-out request kept encoding"
        assert post(port, {"inputs": SENTENCES})[0] == 200

        threading.Thread(target=lambda: post(port, heavy), daemon=True).start()
        time.sleep(0.5)  # in flight
        stopping = time.monotonic()
        process.send_signal(signal.SIGTERM)
        process.wait(30)
        assert time.monotonic() - stopping < 10, time.monotonic() - stopping
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2)
    finally:
        stop(process)
