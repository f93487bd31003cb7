"""The gate's own measurement: a version downloaded, every file checked against the manifest recorded at its
registration, and scored on the dev splits the gate reads.

The gate never decides on score tags: whoever registers a version writes those. Before it moves ``champion`` it
downloads the candidate and the champion (``download.download_verified``), and scores both the same way: the
evaluate stage's fast encoder (``sentcl.model.fast_encode.FastEncoder``) with the folder's own pooling
(``sentcl.evaluation.models.model_pooling``), on STS-B dev and SICK-R trial from the validate stage's pairs table,
and on the domain dev pairs when the registration brought some (``--domain-dev``). A few seconds on 2 cores for
the ~2,000 pairs.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sentcl.params import ROOT
from sentcl.registry.rules import REFUSED, TAG_REFUSED, TAG_STATE, Scores
from sentcl_mlflow.errors import GateDevSetError, GateRefusedError
from sentcl_mlflow.pyfunc_checks import ManifestUnavailableError, WeightsMismatchError
from sentcl_mlflow.registry.download import download_verified, st_folder_in

if TYPE_CHECKING:
    from mlflow import MlflowClient

# The validate stage's table of scored pairs (stages.common.PROCESSED, which this layer cannot import).
DEV_PAIRS = ROOT / "data" / "processed" / "pairs.parquet"

Pair = tuple[str, str, float]
# What scores a downloaded, verified model: (the version, the folder the logged model was downloaded to).
Scorer = Callable[[Any, Path], Scores]


@dataclass(frozen=True)
class DevSets:
    """The pairs the gate scores every model on: STS-B dev, SICK-R trial, and the domain's when given."""

    stsb_dev: tuple[Pair, ...]
    sick_dev: tuple[Pair, ...]
    domain: tuple[Pair, ...] | None = None
    source: str = ""

    @classmethod
    def load(cls, pairs_file: Path | str | None = None, domain_dev: Path | str | None = None) -> DevSets:
        """From the validate stage's ``pairs.parquet`` (the selection sets of ``sentcl.data.roles``) and a domain dev file
        (``sentence1<TAB>sentence2<TAB>score``, as ``--domain-dev`` reads it). Missing or empty: one line."""
        import pandas as pd

        from sentcl.data.domain import DomainTextError, read_flag_pairs

        path = Path(pairs_file or DEV_PAIRS)
        if not path.is_file():
            raise GateDevSetError(
                f"{path}: no dev pairs for the gate to score models on; run `dvc repro validate` first"
            )
        from sentcl.data.roles import selection_sets

        table = pd.read_parquet(path, columns=["task", "split", "sentence1", "sentence2", "score"])
        # The selection role (sentcl.data.roles): STS-B dev as published, SICK-R trial less its test pairs.
        sets = {name: tuple(rows) for name, rows in selection_sets(table).items()}
        stsb = sets["stsb_dev"]
        if len(stsb) < 3:
            raise GateDevSetError(f"{path}: {len(stsb)} STS-B dev pair(s); the gate needs the dev split")
        domain = None
        if domain_dev is not None:
            try:
                domain = tuple(read_flag_pairs(domain_dev))
            except DomainTextError as e:
                raise GateDevSetError(str(e)) from None
        return cls(stsb, sets["sick_trial"], domain, str(path))

    def describe(self) -> str:
        parts = [f"{len(self.stsb_dev)} STS-B dev", f"{len(self.sick_dev)} SICK-R trial"]
        if self.domain is not None:
            parts.append(f"{len(self.domain)} domain dev")
        return " + ".join(parts) + " pairs"


def _spearman(encode: Callable[[Sequence[str]], Any], pairs: Sequence[Pair]) -> float:
    from sentcl.evaluation.sts import STSEvaluator

    return STSEvaluator(list(pairs), name="gate")(encode)


def score_folder(model_dir: Path, dev: DevSets, settings: Mapping[str, Any]) -> Scores:
    """(STS-B dev, {"sick_dev": ...}, domain or None), Spearman x 100, of the sentence-transformers folder inside
    ``model_dir``, encoded as the evaluate stage does (its backend and batch size, the folder's pooling)."""
    from sentcl.evaluation.models import model_pooling
    from sentcl.model.fast_encode import FastEncoder

    folder = st_folder_in(model_dir)
    chosen = model_pooling(folder, dict(settings))
    encoder = FastEncoder(
        folder,
        pooling=chosen.pooling,
        backend=settings["backend"],
        max_tokens=int(settings["max_tokens"]),
        prompt=chosen.prompt,
    )
    guards = {"sick_dev": _spearman(encoder, dev.sick_dev)} if len(dev.sick_dev) >= 3 else {}
    domain = _spearman(encoder, dev.domain) if dev.domain else None
    return _spearman(encoder, dev.stsb_dev), guards, domain


def dev_scorer(dev: DevSets, params: Mapping[str, Any]) -> Scorer:
    """The gate's scorer: ``score_folder`` with params ``evaluate`` (backend, max_tokens, pooling fallback)."""
    from sentcl.evaluation.models import stage_settings

    settings = stage_settings(dict(params))
    return lambda _version, root: score_folder(root, dev, settings)


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


def verified_download(mlc: MlflowClient, name: str, version: str, dest: Path) -> Path:
    """The logged model of ``name`` version ``version`` under ``dest``, every file matching its registration
    manifest; else the version is tagged refused and :class:`GateRefusedError` says which file, in one line."""
    uri = f"models:/{name}/{version}"
    # A refusal is one line on stderr: no download progress bars around it (as sentcl_mlflow.serve does).
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    try:
        root = download_verified(uri, dest)
    except (WeightsMismatchError, ManifestUnavailableError) as e:
        raise refusal(mlc, name, version, str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    return root


def _model_of(version: Any, default: str) -> str:
    return getattr(version, "name", None) or default


def measure(
    mlc: MlflowClient,
    name: str,
    versions: Sequence[Any],
    scorer: Scorer,
    verified: Sequence[Path | None] = (),
) -> list[Scores]:
    """The scores of each model version, in the order given, each downloaded and verified first (all before
    any is scored, so a tampered one stops the gate before minutes of scoring). Each is read from its own
    registered model (``v.name``: a candidate and the champion may live in different ones). ``verified``: by
    position, the folders of versions the caller already downloaded and verified (None: downloaded here)."""
    given = list(verified) + [None] * (len(versions) - len(verified))
    with tempfile.TemporaryDirectory(prefix="sentcl-gate-") as tmp:
        roots = [
            given[i]
            or verified_download(mlc, _model_of(v, name), str(v.version), Path(tmp) / f"{i}-{v.version}")
            for i, v in enumerate(versions)
        ]
        scores: list[Scores] = []
        for v, root in zip(versions, roots, strict=True):
            try:
                scores.append(scorer(v, root))
            # No sentence-transformers folder, or one the encoder cannot load: no model the gate can promote.
            except (OSError, ValueError) as e:
                raise refusal(mlc, _model_of(v, name), str(v.version), unscorable(e)) from None
        return scores
