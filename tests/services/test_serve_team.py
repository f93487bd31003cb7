"""`make serve` on the team's stores (issue 59): ``SENTCL_TEAM_STATE=DIR`` (a state folder of infra/team/team-up)
runs MLflow on its PostgreSQL + S3 (DIR/mlflow.env) and the Prefect server on its ``prefect`` database
(DIR/prefect.env; the password in DIR/secrets/prefect.pgpass, which asyncpg reads through PGPASSFILE).

The refusals run the real infra/serve.sh and stop before anything starts (one line, exit 2; helpers of
tests/services/test_serve_secrets.py). The live test (slow: ~5 minutes on 2 busy cores) starts a stack of its own,
then `make serve` on it on a copy of the checkout with the tiny models of tests/services/test_serve_after_run.py,
runs the retrain deployment once and finds its flow run in PostgreSQL, its candidate in MLflow's PostgreSQL with
the artifacts in S3 under candidates/, and the gate's verdict on it. The second (slow, ~5.5 minutes) runs two
workers (SENTCL_WORKERS=2) and three retrains queued together: three candidates, each judged once."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from sentcl.params import read_params
from sentcl.registry.rules import GateConfig
from sentcl_mlflow import store
from tests.services.conftest import free_port, team_stack
from tests.services.test_gate_attacks import _copy_checkout
from tests.services.test_infra import SECRETS, _environ, _post_prefect, serve_env
from tests.services.test_serve_after_run import _candidate_version, _logs, _tiny_params
from tests.services.test_serve_secrets import GOOD, assert_refused_before_start, run_serve, serve

CONFIG = GateConfig.from_params(read_params())
REGISTRAR = ("sentcl-registrar", SECRETS["SENTCL_REGISTRAR_PASSWORD"])
SECRET_IN_A_FILE = "not-for-anyone-to-print-1"


def fake_state(folder: Path, drop: str = "", **extra: str) -> Path:
    """A state folder as team-up writes it (mlflow.env, prefect.env, the three secret files), on ports nothing
    listens on; ``drop``: a key or file left out; ``extra``: a key=value added to (or replacing one in) the file
    named by its prefix, mlflow__KEY or prefect__KEY."""
    secrets = folder / "secrets"
    secrets.mkdir(parents=True)
    for name in ("mlflow.pgpass", "prefect.pgpass", "s3-registrar.ini"):
        if name != drop:
            (secrets / name).write_text(f"127.0.0.1:1:*:x:{SECRET_IN_A_FILE}\n")
    pg, s3 = free_port(), free_port()
    files = {
        "mlflow.env": {
            "MLFLOW_BACKEND_STORE_URI": f"postgresql+psycopg2://mlflow@127.0.0.1:{pg}/mlflow",
            "SENTCL_MLFLOW_USERS_DB": f"postgresql+psycopg2://mlflow@127.0.0.1:{pg}/mlflow_users",
            "MLFLOW_ARTIFACTS_DESTINATION": "s3://sentcl-artifacts/candidates",
            "MLFLOW_S3_ENDPOINT_URL": f"http://127.0.0.1:{s3}",
            "AWS_SHARED_CREDENTIALS_FILE": str(secrets / "s3-registrar.ini"),
            "PGPASSFILE": str(secrets / "mlflow.pgpass"),
        },
        "prefect.env": {
            "PREFECT_SERVER_DATABASE_CONNECTION_URL": f"postgresql+asyncpg://prefect@127.0.0.1:{pg}/prefect",
            "PGPASSFILE": str(secrets / "prefect.pgpass"),
        },
    }
    for key, value in extra.items():
        where, name = key.split("__")
        files[f"{where}.env"][name] = value
    for name, values in files.items():
        if name != drop:
            text = "".join(f"{k}={v}\n" for k, v in values.items() if k != drop)
            (folder / name).write_text(text)
    return folder


def refused(tmp_path: Path, state: Path | str, *words: str, **environ: str) -> None:
    environ = {"SENTCL_TEAM_STATE": str(state), "SENTCL_MLFLOW_BACKEND": "", **environ}
    out, _ = serve(tmp_path, GOOD, **environ)
    assert_refused_before_start(out, tmp_path, "SENTCL_TEAM_STATE", *words, secret=SECRET_IN_A_FILE)


@pytest.mark.parametrize(
    "drop, extra, words",
    [
        ("prefect.env", {}, ("no readable prefect.env", "team-up")),
        ("mlflow.env", {}, ("no readable mlflow.env",)),
        ("MLFLOW_ARTIFACTS_DESTINATION", {}, ("mlflow.env has no MLFLOW_ARTIFACTS_DESTINATION",)),
        ("prefect.pgpass", {}, ("cannot read the secret file", "prefect.pgpass")),
        ("s3-registrar.ini", {}, ("cannot read the secret file", "s3-registrar.ini")),
        ("", {"mlflow__AWS_SECRET_ACCESS_KEY": SECRET_IN_A_FILE}, ("sets AWS_SECRET_ACCESS_KEY", "not one")),
        (
            "",
            {"prefect__PREFECT_SERVER_DATABASE_PASSWORD": SECRET_IN_A_FILE},
            ("sets PREFECT_SERVER_DATABASE_PASSWORD",),
        ),
        (
            "",
            {
                "prefect__PREFECT_SERVER_DATABASE_CONNECTION_URL": f"postgresql+asyncpg://prefect:{SECRET_IN_A_FILE}@127.0.0.1:5/prefect"
            },
            ("without a password",),
        ),
        ("", {}, ("PostgreSQL on 127.0.0.1:", "does not answer", "team-up")),  # whole, but nothing listens
    ],
    ids=[
        "no-prefect-env",
        "no-mlflow-env",
        "half-mlflow-env",
        "prefect-password-file-gone",
        "s3-key-file-gone",
        "a-secret-in-mlflow-env",
        "a-password-in-prefect-env",
        "a-password-in-the-uri",
        "stores-down",
    ],
)
def test_a_team_state_that_is_not_whole_is_refused_before_anything_starts(
    tmp_path, tmp_path_factory, drop, extra, words
):
    state = fake_state(tmp_path_factory.mktemp("state") / "team", drop, **extra)
    refused(tmp_path, state, *words)


def test_a_missing_folder_or_a_second_store_setting_is_refused(tmp_path, tmp_path_factory):
    refused(tmp_path, tmp_path_factory.mktemp("gone") / "team", "no such folder")
    state = fake_state(tmp_path_factory.mktemp("state") / "team")
    refused(tmp_path, state, "SENTCL_MLFLOW_BACKEND is set as well", SENTCL_MLFLOW_BACKEND="sqlite:///x.db")


def test_the_team_state_may_come_from_the_env_file(tmp_path, tmp_path_factory):
    gone = tmp_path_factory.mktemp("gone") / "team"
    env_file = tmp_path / "dot.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in GOOD.items()) + f"SENTCL_TEAM_STATE={gone}\n")
    env_file.chmod(0o600)
    out = run_serve(tmp_path, env_file, SENTCL_MLFLOW_BACKEND="")
    assert_refused_before_start(out, tmp_path, f"SENTCL_TEAM_STATE={gone}", "no such folder")


# ---------------------------------------------------------------------------------------------- live


def _pg(state: Path, role: str):  # noqa: ANN202 (a psycopg2 connection as ``role`` to its own database)
    import psycopg2

    line = (state / "secrets" / f"{role}.pgpass").read_text().strip()
    host, port, _, user, password = line.split(":", 4)
    return psycopg2.connect(host=host, port=int(port), user=user, password=password, dbname=role)


def _rows(state: Path, role: str, query: str, args: tuple = ()) -> list[tuple]:
    with _pg(state, role) as connection, connection.cursor() as cursor:
        cursor.execute(query, args)
        return cursor.fetchall()


@contextmanager
def _served_on_team(request, tmp_path_factory, **extra: str):  # noqa: ANN001, ANN202
    """A team stack of its own, then `make serve` on it (SENTCL_TEAM_STATE, ``extra`` on top) on a copy of the
    checkout with the tiny models and data of test_serve_after_run.py; `make stop` and team-down afterwards."""
    from tests.tiny import make_tiny_encoder, write_tiny_processed
    from tests.unit.evaluation.test_sts_benchmark import write_mini_senteval
    from tests.unit.training.test_distill import make_tiny_teacher

    with team_stack(request, prefix="sentcl-serve-team-") as team:
        base = Path(
            tempfile.mkdtemp(prefix="sentcl-serve-team-")
        )  # under /tmp, reachable by the worker's account
        base.chmod(0o755)
        checkout = _copy_checkout(base / "checkout")
        work = tmp_path_factory.mktemp("serve-team")
        hub = checkout / "models" / "tiny"
        _tiny_params(checkout, make_tiny_encoder(hub), make_tiny_teacher(hub))
        processed = write_tiny_processed(checkout / "data" / "processed")
        write_mini_senteval(checkout / "data" / "raw")
        dot_env = work / "dot.env"
        dot_env.write_text("".join(f"{k}={v}\n" for k, v in SECRETS.items()))
        dot_env.chmod(0o600)
        prefect_port, mlflow_port = free_port(), free_port()
        env = serve_env(work, dot_env, prefect_port, mlflow_port, SENTCL_GATE_INTERVAL_S="1", **extra)
        env |= {"SENTCL_TEAM_STATE": str(team["state"]), "SENTCL_INBOX": str(base / "inbox")}
        env.pop("SENTCL_MLFLOW_BACKEND")
        try:
            started = time.monotonic()
            out = subprocess.run(
                ["bash", "infra/serve.sh"], cwd=checkout, env=env, capture_output=True, text=True, timeout=600
            )
            assert out.returncode == 0, out.stdout + out.stderr
            yield {
                "team": team,
                "state": team["state"],
                "checkout": checkout,
                "work": work,
                "run": work / "run",
                "inbox": base / "inbox",
                "processed": processed,
                "prefect_port": prefect_port,
                "mlflow": f"http://127.0.0.1:{mlflow_port}",
                "auth": "Basic " + base64.b64encode(SECRETS["PREFECT_AUTH_STRING"].encode()).decode(),
                "served_s": time.monotonic() - started,
                "started": started,
            }
        finally:
            subprocess.run(
                ["bash", "infra/stop.sh"], cwd=checkout, env=env, capture_output=True, text=True, timeout=180
            )
            shutil.rmtree(base, ignore_errors=True)
            store._configured = None


def _start_retrain(served: dict, name: str, seed: int) -> dict:
    """A text of its own in the inbox and a run of sentcl-retrain/retrain-local on it: the flow run (API)."""
    from tests.tiny import tiny_sentences

    sentences = tiny_sentences(40, seed=seed)
    served["inbox"].mkdir(exist_ok=True)
    text = served["inbox"] / name
    text.write_text("\n".join(sentences + [s.upper() + " ." for s in sentences[:10]]) + "\n")
    text.chmod(0o644)
    port, auth = served["prefect_port"], served["auth"]
    deployment = _post_prefect(
        port, auth, "deployments/name/sentcl-retrain/retrain-local", None, method="GET"
    )
    parameters = {"domain_text": str(text), "trigger": "event", "processed": str(served["processed"])}
    return _post_prefect(
        port, auth, f"deployments/{deployment['id']}/create_flow_run", {"parameters": parameters}
    )


def _flow_run_state(served: dict, flow_run_id: str) -> str:
    found = _rows(served["state"], "prefect", "SELECT state_type FROM flow_run WHERE id = %s", (flow_run_id,))
    assert len(found) == 1, found  # the flow run is a row of PostgreSQL's
    return found[0][0]


def _finished(served: dict, flow_run_ids: list[str], seconds: float) -> dict[str, str]:
    deadline = time.monotonic() + seconds
    while True:
        states = {i: _flow_run_state(served, i) for i in flow_run_ids}
        if all(s in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") for s in states.values()):
            return states
        assert time.monotonic() < deadline, (states, _logs(served["run"]))
        time.sleep(3)


def _weights_in_s3(served: dict, candidate) -> list[str]:  # noqa: ANN001 (a ModelVersion)
    """The candidate's weight files in S3 under candidates/ (the MLflow server's destination), listed with the
    reader's key. MLflow 3 logs the model as a LoggedModel: its files are under models/<model id>/."""
    from tests.services.test_team_servers import s3

    logged = re.search(r"\bm-[0-9a-f]{32}\b", candidate.source or "")
    owner = candidate.model_id or (logged.group(0) if logged else candidate.run_id)
    pages = (
        s3(served["team"], "reader")
        .get_paginator("list_objects_v2")
        .paginate(Bucket="sentcl-artifacts", Prefix="candidates/")
    )
    keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
    weights = [k for k in keys if owner in k and k.endswith(".safetensors")]
    assert weights, (candidate.source, owner, len(keys), [k for k in keys if owner in k][:20])
    return weights


def _no_database_locked(run: Path) -> None:
    for log in run.glob("*.log"):
        assert "database is locked" not in log.read_text(errors="replace"), log.name


@pytest.mark.slow
def test_make_serve_on_the_team_stack_keeps_flow_runs_and_the_registry_in_postgres(
    request, tmp_path_factory, monkeypatch
):
    """make serve with SENTCL_TEAM_STATE: the retrain deployment's flow run is a row of the ``prefect`` database,
    its candidate a row of ``mlflow``'s model_versions with its files in S3 under candidates/, the gate judges it;
    no sqlite file of either server's anywhere, and neither server's PostgreSQL password in any environ."""
    from sentcl_mlflow.registry.gatekeeper import verdict
    from tests.services.test_auth import as_user

    began = time.monotonic()
    with _served_on_team(request, tmp_path_factory) as served:
        state, run, work = served["state"], served["run"], served["work"]
        # The Prefect server migrated the `prefect` database in its start-up (before /api/health answered, so
        # before the worker): its tables are there, and no SQLite database of Prefect's or MLflow's exists.
        tables = {t for (t,) in _rows(state, "prefect", "SELECT tablename FROM pg_tables")}
        assert {"flow_run", "deployment", "work_pool", "alembic_version"} <= tables, sorted(tables)
        assert not list((work / "prefect").rglob("*.db")) and not (work / "mlflow.db").exists()
        assert not (served["checkout"] / "mlflow.db").exists() and not list(run.glob("*.db")), sorted(
            run.iterdir()
        )
        # Each server gets its own PGPASSFILE (a path, never the password); the worker neither.
        passwords = {
            role: (state / "secrets" / f"{role}.pgpass").read_text().strip().rsplit(":", 1)[1]
            for role in ("prefect", "mlflow")
        }
        for name in ("prefect-server", "mlflow-server", "worker", "gate", "watcher"):
            pid = int((run / f"{name}.pid").read_text())
            seen = _environ(pid) + Path(f"/proc/{pid}/cmdline").read_bytes()
            for role, password in passwords.items():
                assert password.encode() not in seen, (name, role)
            expected = {"prefect-server": b"prefect.pgpass", "mlflow-server": b"mlflow.pgpass"}.get(name)
            assert (b"PGPASSFILE=" in _environ(pid)) == (expected is not None), name
            if expected:
                assert b"PGPASSFILE=" + str(state / "secrets").encode() + b"/" + expected in _environ(pid)

        flow_run = _start_retrain(served, "domain.txt", seed=9)
        _flow_run_state(served, flow_run["id"])
        monkeypatch.setenv("MLFLOW_TRACKING_URI", served["mlflow"])
        as_user(monkeypatch, REGISTRAR)
        mlc = store.client()
        version = _candidate_version(mlc, seconds=600)
        started = served["started"]
        assert version is not None, f"no candidate {time.monotonic() - started:.0f} s after serve\n" + _logs(
            run
        )
        deadline = time.monotonic() + 300
        while (judged := verdict(mlc, CONFIG.candidate_model_name, version)) is None:
            assert time.monotonic() < deadline, f"no verdict on candidate {version}\n" + _logs(run)
            time.sleep(2)
        assert judged["decision"] in ("promoted", "rejected"), (judged, _logs(run))
        candidate = mlc.get_model_version(CONFIG.candidate_model_name, version)
        assert candidate.tags.get("trigger") == "event", candidate.tags
        # The registry is PostgreSQL's: the version and its gate tags are rows of the mlflow database.
        rows = _rows(
            state,
            "mlflow",
            "SELECT key, value FROM model_version_tags WHERE name = %s AND version = %s",
            (CONFIG.candidate_model_name, int(version)),
        )
        assert ("gate.decision", judged["decision"]) in rows, rows
        _weights_in_s3(served, candidate)
        assert _finished(served, [flow_run["id"]], 120) == {flow_run["id"]: "COMPLETED"}, _logs(run)
        _no_database_locked(run)
        print(
            f"team-up {served['team']['seconds']:.1f} s; make serve on it {served['served_s']:.0f} s; candidate "
            f"{version} {judged['decision']} {time.monotonic() - started:.0f} s after; all "
            f"{time.monotonic() - began:.0f} s"
        )


@pytest.mark.slow
def test_two_workers_on_the_team_stack_judge_three_queued_candidates_each_once(
    request, tmp_path_factory, monkeypatch
):
    """SENTCL_WORKERS=2: two sandboxed workers, one flow run each at a time. Three retrains queued together (the
    deployment's concurrency_limit 1 runs them one after another): each COMPLETED in PostgreSQL, every run of the
    deployment (the watcher's too) on one worker and both workers used, three candidate versions (none lost), each judged once (one decision line in
    the gate's log, its gate tags); champion, sampled all along, never names a version the gate has not
    promoted; no "database is locked" in any log."""
    from sentcl_mlflow.registry.gatekeeper import verdict
    from tests.services.test_auth import as_user
    from tests.services.test_gate_attacks import _champion

    began = time.monotonic()
    with _served_on_team(request, tmp_path_factory, SENTCL_WORKERS="2") as served:
        run = served["run"]
        assert sorted(p.name for p in run.glob("worker*.pid")) == ["worker-2.pid", "worker.pid"]
        queued = time.monotonic()
        flow_runs = [_start_retrain(served, f"domain-{i}.txt", seed=20 + i) for i in range(3)]
        deployment = flow_runs[0]["deployment_id"]
        monkeypatch.setenv("MLFLOW_TRACKING_URI", served["mlflow"])
        as_user(monkeypatch, REGISTRAR)
        mlc = store.client()
        name, champions = CONFIG.candidate_model_name, set()
        deadline = time.monotonic() + 1200
        # The watcher sees the three files land too: the deployment's trigger adds a run per file, without the
        # `processed` parameter: it finds its file archived and ends, or its `dvc repro validate` fails in this
        # copy (no git repository; see test_serve_after_run.py). Those are awaited with ours; the nightly
        # schedule's future runs (auto_scheduled) are not.
        query = "SELECT id, name, state_type FROM flow_run WHERE deployment_id = %s AND NOT auto_scheduled"
        ids, done = {r["id"] for r in flow_runs}, ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")
        while True:
            runs = _rows(served["state"], "prefect", query, (deployment,))
            champion = _champion(mlc)
            if champion is not None:
                champions.add(champion)
            if {str(i) for i, _, _ in runs} >= ids and all(t in done for _, _, t in runs):
                break
            assert time.monotonic() < deadline, (runs, _logs(run))
            time.sleep(3)
        wall = time.monotonic() - queued
        assert [t for i, _, t in runs if str(i) in ids] == ["COMPLETED"] * 3, (runs, _logs(run))
        versions = sorted(int(v.version) for v in mlc.search_model_versions(f"name='{name}'"))
        assert versions == [1, 2, 3], versions  # none lost, none twice
        decisions = {}
        gate_log = (run / "gate.log").read_text()
        for version in map(str, versions):
            judged = verdict(mlc, name, version)
            assert judged is not None and judged["decision"] in ("promoted", "rejected"), (version, judged)
            decisions[version] = judged["decision"]
            pattern = re.compile(rf"\b{re.escape(name)} version {version} (PROMOTED|REJECTED)\b")
            assert len(pattern.findall(gate_log)) == 1, (version, gate_log[-3000:])
            candidate = mlc.get_model_version(name, version)
            assert candidate.tags.get("gate.decision") == judged["decision"], candidate.tags
            _weights_in_s3(served, candidate)
        # Every champion seen names a production version made from a promoted candidate.
        for production in champions:
            tags = mlc.get_model_version(CONFIG.model_name, production).tags
            judged_from = tags.get("gate.candidate", "").rsplit("/", 1)[-1]
            assert decisions.get(judged_from) == "promoted", (production, tags, decisions)
        # Each flow run went to one worker (its "submitted to infrastructure" line), and each worker ran some.
        submitted = re.compile(r"Flow run '([^']+)' submitted to infrastructure")
        ran = {w: submitted.findall((run / f"{w}.log").read_text()) for w in ("worker", "worker-2")}
        assert all(ran.values()) and sorted(sum(ran.values(), [])) == sorted(n for _, n, _ in runs), ran
        _no_database_locked(run)
        print(
            f"two workers: 3 flow runs queued together ({len(runs)} with the watcher's: "
            f"{sorted(t for _, _, t in runs)}), done in {wall:.0f} s; "
            f"versions {decisions}, runs per worker "
            f"{ {w: len(r) for w, r in ran.items()} }, champions seen {sorted(champions)}; make serve "
            f"{served['served_s']:.0f} s; all {time.monotonic() - began:.0f} s"
        )
