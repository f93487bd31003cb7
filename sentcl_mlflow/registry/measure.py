"""The gate's own measurement: a version downloaded, every file checked against the manifest recorded at its
registration, loaded as production loads it, and scored on the dev splits the gate reads.

The gate never decides on score tags: whoever registers a version writes those. Before it moves ``champion`` it
downloads the candidate and the champion (``download.download_verified``) and loads each through the loader that
``models:/sentcl-encoder@champion`` runs (``served_pipeline``): MLflow's ``pyfunc.load_model`` of the logged model,
whose serving code must be byte for byte this repository's (``sentcl_mlflow/pyfunc_encoder.py`` and
``pyfunc_checks.py``), so every module the folder lists (a ``Dense`` after the pooling, a ``Normalize``) takes
part, as it does for a caller. Both are scored the same way on STS-B dev and SICK-R trial from the validate
stage's pairs table, and on the domain dev pairs when the registration brought some (``--domain-dev``); each
version's ``PipelineShape`` (modules, vector size, unit length) is measured on the way, for the gate to compare.
A version with no ``MLmodel`` (a bare sentence-transformers folder) is loaded as sentence-transformers loads it.
Every file the gate reads is bounded by params.yaml ``gate:`` (``GateLimits``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sentcl.registry.dev_sets import MB, DevSets, Pair
from sentcl.registry.rules import (
    REFUSED,
    TAG_REFUSED,
    TAG_STATE,
    GateLimits,
    PipelineShape,
    Scores,
    pipeline_shape,
)
from sentcl_mlflow.errors import GateRefusedError
from sentcl_mlflow.pyfunc_checks import DOWNLOAD_META, ManifestUnavailableError, WeightsMismatchError
from sentcl_mlflow.registry.download import download_verified, st_folder_in

if TYPE_CHECKING:
    from mlflow import MlflowClient

# What scores a downloaded, verified model: (the version, the folder the logged model was downloaded to).
Scorer = Callable[[Any, Path], Scores]
# The serving code a logged model may carry: this repository's own files, byte for byte.
SERVING_CODE = {name: Path(__file__).parents[1] / name for name in ("pyfunc_encoder.py", "pyfunc_checks.py")}
PYFUNC_LOADER = "mlflow.pyfunc.loaders.code_model"  # what the export stage logs: a model from code
PROBE = ("A probe sentence for the served pipeline.", "Another one, to measure its vectors.")


def _spearman(encode: Callable[[Sequence[str]], Any], pairs: Sequence[Pair]) -> float:
    from sentcl.evaluation.sts import STSEvaluator

    return STSEvaluator(list(pairs), name="gate")(encode)


@dataclass(frozen=True)
class Served:
    """A model as production loads it: ``encode`` (sentences -> vectors, the served code), the
    sentence-transformers folder it loaded, and its ``PipelineShape``."""

    encode: Callable[[Sequence[str]], Any]
    folder: Path
    shape: PipelineShape


def check_serving_code(root: Path) -> None:
    """A logged model's ``MLmodel`` loads through MLflow's pyfunc model loader, and each Python file it carries
    (outside its artifacts) is this repository's serving code byte for byte; else ``ValueError``, one line. So
    the code the gate runs to score a version is the code production runs to serve it."""
    import yaml

    try:
        flavor = (
            (yaml.safe_load((root / "MLmodel").read_text()) or {}).get("flavors", {}).get("python_function")
        )
    except yaml.YAMLError as e:
        raise ValueError(f"its MLmodel is not YAML ({type(e).__name__})") from None
    if not isinstance(flavor, dict) or flavor.get("loader_module") != PYFUNC_LOADER:
        loader = flavor.get("loader_module") if isinstance(flavor, dict) else None
        raise ValueError(f"its MLmodel loads through {loader!r}, not {PYFUNC_LOADER!r}")
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] == "artifacts":
            continue
        ours = SERVING_CODE.get(path.name)
        if ours is None or path.read_bytes() != ours.read_bytes():
            raise ValueError(f"its serving code {rel.as_posix()} is not this repository's")


def served_pipeline(root: Path, scratch: Path) -> Served:
    """The logged model under ``root`` (downloaded and verified) loaded as ``models:/...`` loads it for a caller:
    ``mlflow.pyfunc.load_model`` of a copy under ``scratch`` (loading writes nothing into the gate's copy), once
    its serving code is this repository's (``check_serving_code``). A bare sentence-transformers folder (no
    ``MLmodel``): ``SentenceTransformer(folder)``, every module it lists. Unloadable: ``ValueError``/``OSError``."""
    import numpy as np

    if not (root / "MLmodel").is_file():
        from sentence_transformers import SentenceTransformer

        folder = st_folder_in(root)
        model = SentenceTransformer(str(folder), device="cpu")

        def encode(sentences: Sequence[str]) -> Any:
            return model.encode(
                list(sentences), batch_size=64, convert_to_numpy=True, show_progress_bar=False
            )

    else:
        import mlflow

        check_serving_code(root)
        copy = Path(tempfile.mkdtemp(prefix="served-", dir=scratch))
        shutil.copytree(root, copy, dirs_exist_ok=True)
        (copy / DOWNLOAD_META).unlink(missing_ok=True)  # verified already: no second trip to the registry
        try:
            python_model = mlflow.pyfunc.load_model(str(copy)).unwrap_python_model()
        except Exception as e:  # MLflow's own errors: a model production could not load either
            raise ValueError(f"production's loader cannot load it: {type(e).__name__}: {e}") from None
        folder = Path(python_model.folder)

        def encode(sentences: Sequence[str]) -> Any:
            return np.asarray(python_model.predict(None, list(sentences)))

    return Served(encode, folder, pipeline_shape(folder, encode(list(PROBE))))


class DevScorer:
    """The gate's scorer: Spearman x 100 of the served pipeline's cosines on STS-B dev, SICK-R trial and the
    domain's pairs (when given)."""

    def __init__(self, dev: DevSets) -> None:
        self.dev = dev

    def score(self, served: Served) -> Scores:
        dev = self.dev
        guards = {"sick_dev": _spearman(served.encode, dev.sick_dev)} if len(dev.sick_dev) >= 3 else {}
        domain = _spearman(served.encode, dev.domain) if dev.domain else None
        return Scores(_spearman(served.encode, dev.stsb_dev), guards, domain)

    def __call__(self, _version: Any, root: Path) -> Scores:
        with tempfile.TemporaryDirectory(prefix="sentcl-score-") as tmp:
            return self.score(served_pipeline(root, Path(tmp)))


@dataclass(frozen=True)
class Evidence:
    """What the gate scores models on: the validate stage's pairs table (``dev_pairs``, default
    ``dev_sets.DEV_PAIRS``) and a domain's scored pairs (``domain_dev``), which decide (``domain_counts``: an
    operator's, or approved ones) or only inform; ``scorer`` replaces the dev-set scoring (Python callers: tests),
    the verification stays."""

    dev_pairs: Path | str | None = None
    domain_dev: Path | str | None = None
    domain_counts: bool = True
    scorer: Scorer | None = None

    def make_scorer(self, limits: GateLimits) -> Scorer:
        """Built only when the gate gets that far (a blocked or unfinished version needs no dev pairs)."""
        if self.scorer is not None:
            return self.scorer
        dev = DevSets.load(self.dev_pairs, self.domain_dev, limits)
        print(f"gate: scoring on {dev.describe()} ({dev.source})")
        return DevScorer(dev)


def refuse(mlc: MlflowClient, name: str, version: str, reason: str) -> None:
    """Tag ``version`` refused (``sentcl.state=refused``, ``gate.refused=<reason>``): never promoted after this."""
    # The reason first: a reader that sees the state (a registrar waiting on its candidate) sees why too.
    mlc.set_model_version_tag(name, version, TAG_REFUSED, reason[:4000])
    mlc.set_model_version_tag(name, version, TAG_STATE, REFUSED)


def refusal(mlc: MlflowClient, name: str, version: str, reason: str) -> GateRefusedError:
    """``version`` tagged refused, and the one line that says so (for the caller to raise)."""
    refuse(mlc, name, version, reason)
    return GateRefusedError(f"gate refused {name} version {version}: {reason}; champion not moved")


def unscorable(e: Exception) -> str:
    return f"cannot be scored ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"


def verified_download(
    mlc: MlflowClient, name: str, version: str, dest: Path, limits: GateLimits | None = None
) -> Path:
    """The logged model of ``name`` version ``version`` under ``dest``, every file matching its registration
    manifest and (with ``limits``) all of them within ``gate.max_model_mb`` before any is hashed; else the
    version is tagged refused and :class:`GateRefusedError` says which file, in one line."""
    uri = f"models:/{name}/{version}"
    # A refusal is one line on stderr: no download progress bars around it (as sentcl_mlflow.serve does).
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    max_bytes = int(limits.max_model_mb * MB) if limits is not None else None
    try:
        root = download_verified(uri, dest, max_bytes=max_bytes)
    except (WeightsMismatchError, ManifestUnavailableError) as e:
        raise refusal(mlc, name, version, str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    except OverflowError as e:
        raise refusal(mlc, name, version, str(e)) from None
    return root


def _model_of(version: Any, default: str) -> str:
    return getattr(version, "name", None) or default


def _shape_if_loadable(root: Path, scratch: Path) -> PipelineShape | None:
    try:
        return served_pipeline(root, scratch).shape
    except (OSError, ValueError):
        return None


def measure(
    mlc: MlflowClient,
    name: str,
    versions: Sequence[Any],
    scorer: Scorer,
    verified: Sequence[Path | None] = (),
    limits: GateLimits | None = None,
) -> list[tuple[Scores, PipelineShape | None]]:
    """The scores and pipeline shape of each model version, in the order given, each downloaded and verified first
    (all before any is scored, so a tampered one stops the gate before minutes of scoring), then loaded as
    production loads it (``served_pipeline``). Each is read from its own registered model (``v.name``: a
    candidate and the champion may live in different ones). ``verified``: by position, the folders of versions
    the caller already downloaded and verified (None: downloaded here). A version that cannot be loaded or scored
    is tagged refused (:class:`GateRefusedError`)."""
    given = list(verified) + [None] * (len(versions) - len(verified))
    with tempfile.TemporaryDirectory(prefix="sentcl-gate-") as tmp:
        roots = [
            given[i]
            or verified_download(
                mlc, _model_of(v, name), str(v.version), Path(tmp) / f"{i}-{v.version}", limits
            )
            for i, v in enumerate(versions)
        ]
        measured: list[tuple[Scores, PipelineShape | None]] = []
        for v, root in zip(versions, roots, strict=True):
            try:
                if isinstance(scorer, DevScorer):
                    served = served_pipeline(root, Path(tmp))
                    scores, shape = scorer.score(served), served.shape
                else:  # a caller's own scorer (Python callers: tests); the shape where the model loads
                    scores, shape = scorer(v, root), _shape_if_loadable(root, Path(tmp))
            # No sentence-transformers folder, or one the encoder cannot load: no model the gate can promote.
            except (OSError, ValueError) as e:
                raise refusal(mlc, _model_of(v, name), str(v.version), unscorable(e)) from None
            measured.append((scores, shape))
        return measured
