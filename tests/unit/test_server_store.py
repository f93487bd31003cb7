"""The MLflow server's one store switch (sentcl_mlflow.server_store.resolve): the default, a whole team
configuration, and each half-set one refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from sentcl_mlflow.server_store import StoreConfigError, main, resolve

ROOT, RUN = Path("/repo"), Path("/repo/.run")
PG = "postgresql+psycopg2://mlflow@127.0.0.1:5432/mlflow"
TEAM = {
    "MLFLOW_BACKEND_STORE_URI": PG,
    "MLFLOW_ARTIFACTS_DESTINATION": "s3://sentcl-artifacts/candidates",
    "MLFLOW_S3_ENDPOINT_URL": "http://127.0.0.1:8333",
    "AWS_SHARED_CREDENTIALS_FILE": "/state/secrets/s3-registrar.ini",
}


def test_nothing_set_is_the_embedded_sqlite_store_and_the_folder_beside_it():
    found = resolve({}, ROOT, RUN)
    assert (found.backend, found.artifacts, found.team) == (
        "sqlite:////repo/mlflow.db",
        "/repo/mlartifacts",
        False,
    )
    assert found.users_db == "sqlite:////repo/.run/mlflow-users.db"


def test_a_whole_team_configuration_is_taken_and_arguments_win_over_it():
    found = resolve(TEAM, ROOT, RUN)
    assert (found.backend, found.artifacts, found.team) == (PG, "s3://sentcl-artifacts/candidates", True)
    keys = {k: v for k, v in TEAM.items() if k != "AWS_SHARED_CREDENTIALS_FILE"}
    assert resolve({**keys, "AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}, ROOT, RUN).team
    args = resolve({}, ROOT, RUN, "sqlite:////x/mlflow.db", "/x/art")
    assert (args.backend, args.artifacts) == ("sqlite:////x/mlflow.db", "/x/art")


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({**TEAM, "MLFLOW_ARTIFACTS_DESTINATION": "/srv/artifacts"}, "needs an s3://"),
        ({k: v for k, v in TEAM.items() if k != "MLFLOW_ARTIFACTS_DESTINATION"}, "is not: set both"),
        ({k: v for k, v in TEAM.items() if k != "MLFLOW_BACKEND_STORE_URI"}, "is not: set both"),
        ({**TEAM, "MLFLOW_BACKEND_STORE_URI": "sqlite:////x/mlflow.db"}, "postgresql:// MLFLOW_BACKEND"),
        ({k: v for k, v in TEAM.items() if k != "AWS_SHARED_CREDENTIALS_FILE"}, "without a key"),
        ({**TEAM, "AWS_ACCESS_KEY_ID": "only-the-id"}, "half an S3 key"),
        ({**TEAM, "MLFLOW_BACKEND_STORE_URI": PG.replace("mlflow@", "mlflow:pw@")}, "PGPASSFILE"),
        ({**TEAM, "SENTCL_MLFLOW_USERS_DB": PG.replace("mlflow@", "mlflow:pw@")}, "SENTCL_MLFLOW_USERS_DB"),
        ({"MLFLOW_S3_ENDPOINT_URL": "http://127.0.0.1:8333"}, "unset the endpoint"),
    ],
)
def test_a_half_set_team_configuration_is_refused_in_one_line(env, says):
    with pytest.raises(StoreConfigError, match=says) as refused:
        resolve(env, ROOT, RUN)
    assert "\n" not in str(refused.value)


def test_the_entry_point_exits_2_with_one_line_before_anything_starts(monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_BACKEND_STORE_URI", PG)
    monkeypatch.delenv("MLFLOW_ARTIFACTS_DESTINATION", raising=False)
    assert main(["--root", "/repo", "--run-dir", "/repo/.run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mlflow-server: ") and err.count("\n") == 1
    assert main(["--root", "/repo", "--run-dir", "/repo/.run", "sqlite:////x/m.db", "/x/a"]) == 0
    assert capsys.readouterr().out.splitlines()[:2] == ["sqlite:////x/m.db", "/x/a"]
