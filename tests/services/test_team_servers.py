"""A team's servers for real, without docker: ``infra/team/team-up`` (PostgreSQL + SeaweedFS's S3 gateway on
loopback), the MLflow server of ``infra/mlflow-server.sh`` on them (backend on PostgreSQL, artifacts proxied to
S3, basic auth), a model version logged, registered, given an alias and loaded back through the proxy, its bytes
read from S3 with the reader's key; then what each S3 key and database role may not do, and ``team-down``."""

from __future__ import annotations

import hashlib
import stat
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.paths import ROOT
from tests.services.conftest import env_file

TEAM = ROOT / "infra" / "team" / "team.py"


def s3(team, role: str):  # noqa: ANN201
    sys.path.insert(0, str(TEAM.parent))
    import team as team_module

    config = team_module.State(team["state"]).load()
    return team_module.s3_client(config, team_module.State(team["state"]), role)


def denied(call) -> str:  # noqa: ANN001
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError) as refused:
        call()
    return refused.value.response["Error"]["Code"]


def test_team_up_keeps_its_secrets_0600_and_never_prints_them(team):
    state = team["state"]
    printed = team["up"].stdout + team["up"].stderr
    files = sorted((state / "secrets").iterdir())
    assert {f.name for f in files} >= {"mlflow.pgpass", "prefect.pgpass", "s3-gate.ini", "s3-registrar.ini"}
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        for line in path.read_text().splitlines():
            value = line.rsplit(":", 1)[-1].split("=", 1)[-1].strip()
            if len(value) >= 16:
                assert value not in printed, f"{path.name} printed"
    assert "up in" in printed and team["seconds"] < 60


def test_a_model_version_lands_in_s3_through_the_proxy_and_loads_by_alias(team, team_mlflow_env, tmp_path):
    import mlflow
    from mlflow import MlflowClient

    # Without credentials the server answers 401 (basic auth).
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(
            f"{team_mlflow_env['uri']}/api/2.0/mlflow/experiments/search?max_results=1", timeout=10
        )
    assert refused.value.code == 401
    from tests.tiny import make_tiny_encoder

    folder = make_tiny_encoder(tmp_path, "tiny")
    weights = (folder / "model.safetensors").read_bytes()
    server_uri = team_mlflow_env["uri"]
    mlc = MlflowClient(server_uri, server_uri)
    experiment = mlc.create_experiment("team-test")
    assert mlc.get_experiment(experiment).artifact_location.startswith("mlflow-artifacts:")  # proxied
    run = mlc.create_run(experiment).info.run_id
    mlc.log_artifacts(run, str(folder), "model")
    mlc.set_terminated(run)
    mlc.create_registered_model("sentcl-team-test")
    version = mlc.create_model_version(
        "sentcl-team-test", f"{mlc.get_run(run).info.artifact_uri}/model", run_id=run
    ).version
    mlc.set_registered_model_alias("sentcl-team-test", "champion", version)
    loaded = Path(
        mlflow.artifacts.download_artifacts("models:/sentcl-team-test@champion", dst_path=str(tmp_path))
    )
    assert (loaded / "model.safetensors").read_bytes() == weights
    # The bytes are in S3 under candidates/ (the server's destination), readable with the reader's key.
    reader = s3(team, "reader")
    keys = [o["Key"] for o in reader.list_objects_v2(Bucket="sentcl-artifacts")["Contents"]]
    stored = [
        k
        for k in keys
        if k.startswith("candidates/") and k.endswith(f"{run}/artifacts/model/model.safetensors")
    ]
    assert len(stored) == 1, keys
    body = reader.get_object(Bucket="sentcl-artifacts", Key=stored[0])["Body"].read()
    assert hashlib.sha256(body).digest() == hashlib.sha256(weights).digest()
    # The run and the version are rows in PostgreSQL, not a sqlite file.
    import psycopg2

    password = (team["state"] / "secrets" / "mlflow.pgpass").read_text().strip().rsplit(":", 1)[1]
    port = team_module_config(team)["postgres_port"]
    with psycopg2.connect(
        host="127.0.0.1", port=port, user="mlflow", password=password, dbname="mlflow"
    ) as c:
        with c.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM runs WHERE run_uuid = %s", (run,))
            assert cursor.fetchone()[0] == 1
            cursor.execute(  # this test's model: others on the session's stack have a champion too
                "SELECT version FROM registered_model_aliases WHERE alias = 'champion' AND name = %s",
                ("sentcl-team-test",),
            )
            assert [str(v) for (v,) in cursor.fetchall()] == [str(version)]
    print(f"team-up {team['seconds']:.1f} s, MLflow server on them {team_mlflow_env['seconds']:.1f} s")


def test_each_s3_key_can_do_only_its_own_part(team):
    gate, registrar, reader, dvc = (s3(team, r) for r in ("gate", "registrar", "reader", "dvc"))
    key = "production/sentcl-encoder/1/model.safetensors"
    gate.put_object(Bucket="sentcl-artifacts", Key=key, Body=b"production bytes")
    registrar.put_object(Bucket="sentcl-artifacts", Key="candidates/x/weights.bin", Body=b"candidate")
    assert (
        denied(lambda: registrar.put_object(Bucket="sentcl-artifacts", Key=key, Body=b"evil"))
        == "AccessDenied"
    )
    assert denied(lambda: registrar.delete_object(Bucket="sentcl-artifacts", Key=key)) == "AccessDenied"
    assert denied(lambda: reader.put_object(Bucket="sentcl-artifacts", Key="candidates/r", Body=b"r")) == (
        "AccessDenied"
    )
    assert denied(lambda: reader.delete_object(Bucket="sentcl-artifacts", Key=key)) == "AccessDenied"
    assert reader.get_object(Bucket="sentcl-artifacts", Key=key)["Body"].read() == b"production bytes"
    dvc.put_object(Bucket="sentcl-dvc", Key="cache/ab/cdef", Body=b"data")
    assert denied(lambda: dvc.get_object(Bucket="sentcl-artifacts", Key=key)) == "AccessDenied"
    assert denied(lambda: gate.put_object(Bucket="sentcl-dvc", Key="cache/x", Body=b"x")) == "AccessDenied"


def test_a_wrong_key_and_the_storage_internals_are_refused(team):
    import boto3

    config = env_file(team["state"] / "mlflow.env")
    wrong = boto3.client(
        "s3",
        endpoint_url=config["MLFLOW_S3_ENDPOINT_URL"],
        aws_access_key_id=s3(team, "reader")._request_signer._credentials.access_key,
        aws_secret_access_key="not-the-reader-secret-at-all",
        region_name="us-east-1",
    )
    assert denied(lambda: wrong.list_objects_v2(Bucket="sentcl-artifacts")) in (
        "SignatureDoesNotMatch",
        "AccessDenied",
    )
    sys.path.insert(0, str(TEAM.parent))
    import team as team_module

    ports = team_module.State(team["state"]).load()["weed_ports"]
    # The filer's HTTP API would bypass S3's identities: without its JWT it answers 401.
    url = f"http://127.0.0.1:{ports['filer']}/buckets/sentcl-artifacts/"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=5)
    assert refused.value.code == 401


def test_each_database_role_reaches_only_its_own_database(team):
    import psycopg2

    state = team["state"]
    port = team_module_config(team)["postgres_port"]
    prefect = (state / "secrets" / "prefect.pgpass").read_text().strip().rsplit(":", 1)[1]
    with psycopg2.connect(
        host="127.0.0.1", port=port, user="prefect", password=prefect, dbname="prefect"
    ) as c:
        assert c.server_version >= 150000
    with pytest.raises(psycopg2.OperationalError, match="permission denied"):
        psycopg2.connect(host="127.0.0.1", port=port, user="prefect", password=prefect, dbname="mlflow")
    with pytest.raises(psycopg2.OperationalError, match="password authentication failed"):
        psycopg2.connect(
            host="127.0.0.1", port=port, user="mlflow", password="wrong-password", dbname="mlflow"
        )


def team_module_config(team) -> dict:  # noqa: ANN001
    sys.path.insert(0, str(TEAM.parent))
    import team as team_module

    return team_module.State(team["state"]).load()
