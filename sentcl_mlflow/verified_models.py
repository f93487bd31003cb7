"""``models:/`` downloads checked before anything of the model is read or run.

MLflow resolves ``models:/NAME/VERSION`` (and ``models:/NAME@ALIAS``) through its ``models`` artifact repository
for every caller: ``mlflow.pyfunc.load_model``, ``mlflow models serve``, ``mlflow.artifacts.download_artifacts``.
This package registers :class:`VerifiedModelsArtifactRepository` in its place (pyproject.toml, the entry point
group ``mlflow.artifact_repository``, name ``models``): the same download, then every file compared with the
manifest the gate recorded at registration (``sentcl.manifest``), ``__pycache__`` included, before the download
is handed back. ``load_model`` reads ``MLmodel`` and imports the model's code (``pyfunc_encoder.py``, its
``code/``) only after that, so a changed file never runs: loading raises :class:`ModelTamperedError` in one line.

A model registered without a manifest or weights record (not a sentcl model) passes unchanged, as does a logged
model (``models:/m-...``), which has no registration to check against.
"""

from __future__ import annotations

from pathlib import Path

from mlflow.store.artifact.models_artifact_repo import ModelsArtifactRepository

from sentcl_mlflow.pyfunc_checks import verify_registered


class VerifiedModelsArtifactRepository(ModelsArtifactRepository):
    """MLflow's ``models:/`` repository; a registered version's download is checked against its manifest."""

    def download_artifacts(self, artifact_path, dst_path=None, lineage_header_info=None):  # noqa: ANN001, ANN201
        path = super().download_artifacts(artifact_path, dst_path, lineage_header_info=lineage_header_info)
        if self.model_name is not None and self.model_version is not None:
            name, version = str(self.model_name), str(self.model_version)
            verify_registered(
                Path(path), name, version, below=artifact_path or "", registry_uri=self.registry_uri
            )
        return path
