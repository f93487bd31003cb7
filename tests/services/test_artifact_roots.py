"""sentcl_mlflow.artifact_roots: the experiments `make run` creates, handed to `make serve`'s MLflow server, and a
process without a server that logs into them afterwards. Real sqlite stores and MLflow's own client; the live
path under `make serve` is tests/services/test_serve_after_run.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from sentcl_mlflow import store
from sentcl_mlflow.artifact_roots import artifact_repository, main, proxy_experiments


@pytest.fixture
def make_run_store(tmp_path, monkeypatch):
    """A store as `make run` leaves it: sqlite, the shared experiment created by store.experiment_id (its root
    the folder beside the database), one run with an artifact."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    store._configured = None
    mlc = store.client()
    experiment = store.experiment_id(mlc)
    run = mlc.create_run(experiment).info.run_id
    mlc.log_text(run, "before", "note.txt")
    mlc.set_terminated(run)
    yield uri, mlc, experiment, run
    store._configured = None


def test_make_serve_hands_make_runs_experiment_to_the_server_and_a_run_without_one_still_logs(
    make_run_store, tmp_path
):
    import mlflow

    uri, mlc, experiment, before = make_run_store
    folder = tmp_path / "mlartifacts"
    assert mlc.get_experiment(experiment).artifact_location == folder.as_uri()  # what make run creates

    changed = proxy_experiments(uri, (store.EXPERIMENT,))
    assert changed == [(store.EXPERIMENT, folder.as_uri(), f"mlflow-artifacts:/{experiment}")]
    assert mlc.get_experiment(experiment).artifact_location == f"mlflow-artifacts:/{experiment}"
    assert proxy_experiments(uri, (store.EXPERIMENT,)) == []  # a second make serve changes nothing
    # The run logged before keeps its files, now addressed as the server serves them.
    assert mlc.get_run(before).info.artifact_uri == f"mlflow-artifacts:/{before}/artifacts"
    assert (folder / before / "artifacts" / "note.txt").read_text() == "before"
    got = mlflow.artifacts.download_artifacts(
        run_id=before, artifact_path="note.txt", dst_path=str(tmp_path / "a")
    )
    assert Path(got).read_text() == "before"
    # A later `make run` (no server): its new run's root is the server's, and it writes the same folder itself,
    # where the server serves it (<folder>/<experiment>/<run>/artifacts, as for the experiments it creates).
    after = mlc.create_run(experiment).info.run_id
    assert mlc.get_run(after).info.artifact_uri == f"mlflow-artifacts:/{experiment}/{after}/artifacts"
    mlc.log_text(after, "after", "note.txt")
    assert (folder / experiment / after / "artifacts" / "note.txt").read_text() == "after"
    assert [f.path for f in mlc.list_artifacts(after)] == ["note.txt"]
    got = mlflow.artifacts.download_artifacts(
        run_id=after, artifact_path="note.txt", dst_path=str(tmp_path / "b")
    )
    assert Path(got).read_text() == "after"


def test_an_experiment_of_ours_the_server_cannot_serve_is_one_line_exit_2(tmp_path, capsys):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    elsewhere = (tmp_path / "elsewhere").as_uri()
    mlc = MlflowClient(tracking_uri=uri)
    mlc.create_experiment(store.EXPERIMENT, artifact_location=elsewhere)
    mlc.create_experiment("someone-elses", artifact_location=elsewhere)

    capsys.readouterr()  # MLflow's own lines of creating the store
    assert main(["--store", uri]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"serve: experiment '{store.EXPERIMENT}' keeps its")
    assert "outside" in err and "SENTCL_MLFLOW_EXPERIMENT" in err
    assert mlc.get_experiment_by_name(store.EXPERIMENT).artifact_location == elsewhere  # nothing changed
    assert main(["--store", f"sqlite:///{tmp_path / 'none.db'}"]) == 0  # no store yet: the server makes it


def test_mlflow_artifacts_uris_go_to_the_server_unless_the_process_tracks_to_sqlite(tmp_path):
    from mlflow.exceptions import MlflowException
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
    from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository
    from mlflow.store.artifact.mlflow_artifacts_repo import MlflowArtifactsRepository

    served = get_artifact_repository(
        "mlflow-artifacts:/3/abc/artifacts", tracking_uri="http://127.0.0.1:5000"
    )
    assert type(served) is MlflowArtifactsRepository  # MLflow's own, through the server
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    local = get_artifact_repository("mlflow-artifacts:/3/abc/artifacts", tracking_uri=uri)  # this package's
    assert isinstance(local, LocalArtifactRepository)
    assert Path(local.artifact_dir) == tmp_path / "mlartifacts" / "3" / "abc" / "artifacts"
    with pytest.raises(MlflowException):
        artifact_repository("mlflow-artifacts:/3/../../../etc", tracking_uri=uri)
