"""Prefect flows against the Prefect test harness (a real temporary Prefect server for the session).

The pipeline flow runs real `dvc repro` in a scratch DVC repository; the promotion flow runs the real gate on
a scratch MLflow store under the server-wide concurrency limit; the watcher emits a real event.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from stages import tracking

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def prefect_server():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture
def scratch_store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    return tmp_path


@pytest.fixture
def dvc_repo(tmp_path):
    """A scratch git + DVC repository with two stages; the second fails once with a transient-looking error."""
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=repo, check=True)
    flaky = (
        "import pathlib,sys; c=pathlib.Path('attempts'); n=int(c.read_text()) if c.exists() else 0; "
        "c.write_text(str(n+1)); "
        "sys.exit('ConnectionError: connection refused') if n == 0 else pathlib.Path('b.txt').write_text('b')"
    )
    (repo / "flaky.py").write_text(flaky)
    (repo / "dvc.yaml").write_text(
        "stages:\n"
        "  a:\n    cmd: python -c \"open('a.txt','w').write('a')\"\n    outs: [a.txt]\n"
        "  b:\n    cmd: python flaky.py\n    deps: [a.txt]\n    outs: [b.txt]\n"
    )
    return repo


def test_pipeline_runs_dvc_stages_retries_transient_failures_and_lets_dvc_skip(prefect_server, dvc_repo):
    from flows.pipeline import pipeline, stage_names

    assert stage_names(dvc_repo) == ["a", "b"]
    assert pipeline(repo=str(dvc_repo), retry_delay_s=0) == ["a", "b"]
    assert (dvc_repo / "b.txt").read_text() == "b"
    assert (dvc_repo / "attempts").read_text() == "2"  # failed once (transient), retried once
    state = pipeline(repo=str(dvc_repo), retry_delay_s=0, return_state=True)
    assert state.is_completed()
    assert (dvc_repo / "attempts").read_text() == "2"  # DVC said up to date: the stage did not run again


def test_pipeline_does_not_retry_a_real_failure(prefect_server, dvc_repo):
    from flows.pipeline import pipeline

    (dvc_repo / "flaky.py").write_text(
        "import sys, pathlib\npathlib.Path('attempts').write_text('x')\nsys.exit(3)\n"
    )
    state = pipeline(repo=str(dvc_repo), retry_delay_s=0, return_state=True)
    assert state.is_failed()
    assert (dvc_repo / "attempts").read_text() == "x"


def test_promote_flow_holds_the_global_limit_and_runs_the_gate(prefect_server, scratch_store):
    from prefect.client.orchestration import get_client

    from flows.common import PROMOTION_LIMIT
    from flows.promote import promote_flow

    mlc = tracking.client()
    run_id = mlc.create_run(tracking.experiment_id(mlc)).info.run_id
    (scratch_store / "m").mkdir()
    (scratch_store / "m" / "w.bin").write_bytes(b"w")
    mlc.log_artifacts(run_id, str(scratch_store / "m"), "model")
    source = f"{mlc.get_run(run_id).info.artifact_uri}/model"
    tracking.register_candidate(source, 70.0, {"STS12": 60.0}, name="flow-test", run_id=run_id)
    result = promote_flow(actor="ci", model="flow-test")
    assert result["promoted"] and result["champion_after"] == "1"
    with get_client(sync_client=True) as client:
        limit = client.read_global_concurrency_limit_by_name(PROMOTION_LIMIT)
    assert limit.limit == 1


def test_watcher_reports_a_landed_file_once_it_stops_growing(tmp_path):
    from flows.watch import InboxHandler, watch

    seen: list[Path] = []
    observer = watch(tmp_path, InboxHandler(emit=seen.append, settle_s=0.3))
    try:
        (tmp_path / ".hidden").write_text("ignored")
        (tmp_path / "new.txt").write_text("a sentence\nanother one\n")
        deadline = time.monotonic() + 15
        while not seen and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        observer.stop()
        observer.join()
    assert [p.name for p in seen] == ["new.txt"]


def test_watcher_event_reaches_the_prefect_server(prefect_server, tmp_path):
    from flows.watch import emit_arrival

    path = tmp_path / "domain.txt"
    path.write_text("a sentence\nanother one\n")
    emit_arrival(path)  # raises if the server refuses it


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"", "no sentences"), (b"\x00\x01binary\x00", "binary"), (b"same\nsame\nsame\n", "1 distinct")],
)
def test_retrain_refuses_bad_text_before_training(tmp_path, capsys, content, message):
    """Bad text stops the CLI with exit code 2 and a message, before any server, download or training."""
    from flows.retrain import main

    text = tmp_path / "domain.txt"
    text.write_bytes(content)
    assert main(["--domain-text", str(text)]) == 2
    assert message in capsys.readouterr().err


# ---------------------------------------------------------------- quiet logs, one Prefect home (issue 14)


def test_a_progress_bar_becomes_at_most_a_few_lines_of_the_flow_log(capsys):
    """A stage that redraws a bar 500 times gives the flow's log its final state, not 500 lines."""
    from flows.common import run_stage

    bar = (
        "import sys\n"
        "print('loading', flush=True)\n"
        "for i in range(500): sys.stderr.write(f'\\rencode {i}/500'); sys.stderr.flush()\n"
        "sys.stderr.write('\\rencode 500/500\\n'); sys.stderr.write('\\r' + ' ' * 20 + '\\r')\n"
        "print('done', flush=True)\n"
    )
    output = run_stage([sys.executable, "-c", bar])
    printed = capsys.readouterr().out.splitlines()
    assert printed == ["loading", "encode 500/500", "done"]
    assert output.splitlines() == printed


def test_every_entry_point_runs_with_telemetry_off_and_one_prefect_home(tmp_path):
    """A fresh `python -m flows...` process (no variables set) sees analytics off and PREFECT_HOME = .prefect/."""
    import os

    env = {
        k: v for k, v in os.environ.items() if k not in ("DO_NOT_TRACK", "PREFECT_HOME", "PREFECT_API_URL")
    }
    env |= {"SENTCL_RUN_DIR": str(tmp_path)}  # no `make serve` running for this checkout
    probe = (
        "import flows, os, json; print(json.dumps({k: os.environ.get(k) for k in "
        "['PREFECT_HOME', 'PREFECT_SERVER_ANALYTICS_ENABLED', 'MLFLOW_DISABLE_TELEMETRY', 'DO_NOT_TRACK', "
        "'PREFECT_API_URL']}))"
    )
    import json

    seen = json.loads(
        subprocess.run(
            [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, check=True
        ).stdout
    )
    assert seen["PREFECT_HOME"] == str(ROOT / ".prefect")
    assert seen["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false" and seen["MLFLOW_DISABLE_TELEMETRY"] == "true"
    assert seen["DO_NOT_TRACK"] == "1" and seen["PREFECT_API_URL"] is None
    # While `make serve` runs (its pid alive, its URL recorded), a flow started by hand uses that server.
    (tmp_path / "prefect-server.pid").write_text(str(os.getpid()))
    (tmp_path / "prefect-api-url").write_text("http://127.0.0.1:4321/api\n")
    seen = json.loads(
        subprocess.run(
            [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, check=True
        ).stdout
    )
    assert seen["PREFECT_API_URL"] == "http://127.0.0.1:4321/api"
