"""The registry's rules, with no I/O: the gate, what blocks a promotion.

``GateConfig`` is built from params.yaml's ``registry:`` section only (params.yaml is the one home of every
value: this module has no defaults of its own). The MLflow side (registering, aliases, locks) lives in
``sentcl_mlflow.registry`` and calls these functions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sentcl.digest import file_sha256
from sentcl.params import ParamsError, read_section, real_number, text, whole_number

# The dev splits the gate guards besides STS-B dev (a key of metrics/sts.json's rows each): SICK-R trial. STS12-16
# have no train or dev split in SentEval's files, so no STS12 dev split can be carved from them.
DEV_GUARDS = ("sick_dev",)

# Tags on a model version that the gate reads or writes. sts_all (the seven test tasks) is written for the
# record only.
TAG_STSB_DEV, TAG_STS, TAG_DOMAIN = "stsb_dev", "sts_all", "domain_spearman"
TAG_DEV = "dev_scores"  # JSON {guard: spearman} of DEV_GUARDS
TAG_WEIGHTS = "weights.sha256"  # one digest over every weight file: the identity of "the same weights"
TAG_STATE = "sentcl.state"  # registering -> ready; a version left at "registering" is unfinished
REGISTERING, READY = "registering", "ready"  # the values of TAG_STATE on the way
TAG_ROLLED_BACK = "rolled_back"  # "true" on a demoted version: never promoted again without --force
REFUSED = "refused"  # TAG_STATE of a version whose files failed the gate's check: never promoted, even forced
TAG_REFUSED = "gate.refused"  # why the gate refused it (the file, or what could not be scored)
# The gate decides on its own measurements (``Scores.tags``: it downloads, verifies and scores each model);
# the registrant's score tags above are kept for the record and never decide a promotion.


@dataclass(frozen=True)
class Scores:
    """One model's scores as the gate reads them, all Spearman x 100 of dev splits only: STS-B dev, the dev
    guards (``DEV_GUARDS``: SICK-R trial) and the domain's pairs when there are some. The seven test tasks are
    reported (tag sts_all) and never read by the gate, so they play no part in model selection."""

    stsb_dev: float | None
    guards: Mapping[str, float] = dataclasses.field(default_factory=dict)
    domain: float | None = None

    @classmethod
    def from_tags(cls, tags: Mapping[str, str] | None) -> Scores:
        """A version's registration tags (``stsb_dev``, ``dev_scores``, ``domain_spearman``; never sts_all)."""
        tags = tags or {}
        stsb = float(tags[TAG_STSB_DEV]) if tags.get(TAG_STSB_DEV) not in (None, "") else None
        table = json.loads(tags.get(TAG_DEV) or "{}")
        domain = float(tags[TAG_DOMAIN]) if tags.get(TAG_DOMAIN) not in (None, "") else None
        return cls(stsb, {k: float(v) for k, v in table.items()}, domain)

    def tags(self, prefix: str = "gate.") -> dict[str, str]:
        """The tags that record the gate's own measurement: ``gate.stsb_dev``, ``gate.<guard>``
        (``gate.sick_dev``), ``gate.domain_dev``; ``prefix`` "gate.champion_" for the champion it was compared with."""
        tags = {f"{prefix}stsb_dev": f"{self.stsb_dev:.4f}"} if self.stsb_dev is not None else {}
        tags.update({f"{prefix}{guard}": f"{value:.4f}" for guard, value in sorted(self.guards.items())})
        if self.domain is not None:
            tags[f"{prefix}domain_dev"] = f"{self.domain:.4f}"
        return tags

    def text(self) -> str:
        """``stsb_dev 81.20, sick_dev 75.10, domain_dev 60.00``: a measurement in one log line."""
        return ", ".join(f"{k.rpartition('.')[2]} {float(v):.2f}" for k, v in self.tags().items())


@dataclass(frozen=True)
class GateConfig:
    """params.yaml ``registry:``; every field is required there."""

    model_name: str  # the production registered model (aliases champion / challenger)
    experiment_model_name: str  # where `dvc exp run` / `make exp` register unless asked otherwise
    candidate_model_name: str  # the registrar (make serve) registers here; the gate process judges it
    min_delta: float  # STS-B dev gain over the champion that counts as better
    max_dev_drop: float  # no dev score (SICK-R trial, the domain's) may drop by more than this
    min_domain_delta: float  # with a domain dev set: a domain gain this large counts as a gain

    @classmethod
    def from_params(cls, params: Mapping[str, Any], section: str = "registry") -> GateConfig:
        raw = read_section(params, section, [f.name for f in dataclasses.fields(cls)])
        values: dict[str, Any] = {}
        for name in ("model_name", "experiment_model_name", "candidate_model_name"):
            values[name] = text(raw[name], f"{section}.{name}", "a non-empty name")
        for name in ("min_delta", "max_dev_drop", "min_domain_delta"):
            # >= 0: a negative margin could promote a worse model
            values[name] = real_number(raw[name], f"{section}.{name}", minimum=0)
        if values["model_name"] == values["experiment_model_name"]:
            raise ParamsError(
                f"params.yaml: {section}.experiment_model_name must differ from model_name "
                f"({values['model_name']!r}): experiments would register into production"
            )
        if values["candidate_model_name"] in (values["model_name"], values["experiment_model_name"]):
            raise ParamsError(
                f"params.yaml: {section}.candidate_model_name must differ from model_name and "
                f"experiment_model_name ({values['candidate_model_name']!r}): the registrar would edit it"
            )
        return cls(**values)


@dataclass(frozen=True)
class GateLimits:
    """params.yaml ``gate:``: how much the gate reads of what others wrote (the dev pairs table, a candidate's
    domain pairs, a model's files). Larger: refused in one line before it is read."""

    max_pairs_table_mb: float  # the validate stage's pairs.parquet
    max_domain_mb: float  # a candidate's domain dev pairs file
    max_domain_pairs: int  # rows of that file
    max_model_mb: float  # every file of one model version together

    @classmethod
    def from_params(cls, params: Mapping[str, Any], section: str = "gate") -> GateLimits:
        raw = read_section(params, section, [f.name for f in dataclasses.fields(cls)])
        values: dict[str, Any] = {
            name: real_number(raw[name], f"{section}.{name}", above=0)
            for name in ("max_pairs_table_mb", "max_domain_mb", "max_model_mb")
        }
        values["max_domain_pairs"] = whole_number(
            raw["max_domain_pairs"], f"{section}.max_domain_pairs", minimum=1
        )
        return cls(**values)


@dataclass(frozen=True)
class LeaseTimes:
    """params.yaml ``promotion:``: how long a holder of the promotion lease may go without renewing it before
    the next contender breaks it (``lease_s``), and how long a contender waits for it (``wait_s``), seconds."""

    lease_s: float
    wait_s: float

    @classmethod
    def from_params(cls, params: Mapping[str, Any], section: str = "promotion") -> LeaseTimes:
        raw = read_section(params, section, [f.name for f in dataclasses.fields(cls)])
        return cls(**{name: real_number(raw[name], f"{section}.{name}", above=0) for name in raw})


@dataclass(frozen=True)
class GateSettings:
    """params.yaml's ``registry:``, ``gate:`` and ``promotion:``, from the params the entry point parsed."""

    config: GateConfig
    limits: GateLimits
    lease: LeaseTimes

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> GateSettings:
        return cls(
            GateConfig.from_params(params), GateLimits.from_params(params), LeaseTimes.from_params(params)
        )


@dataclass(frozen=True)
class Registration:
    """What a registration brings: the logged model (or a function that logs it only when a new version is
    needed, returning (model URI, run id)), the registrant's scores (kept for the record: the gate measures its
    own), the registered model (None: ``names.target_model_name``), its tags, the run that logged it and the
    digest of its weights (``rules.weights_fingerprint``)."""

    model_uri: str | Callable[[], tuple[str, str | None]]
    stsb_dev: float
    sts_all: Mapping[str, float]
    name: str | None = None
    tags: Mapping[str, Any] | None = None
    run_id: str | None = None
    weights_sha256: str | None = None

    def record(self, run_id: str | None, commit: str | None) -> dict[str, str]:
        """The tags a new version starts with (``sentcl.state=registering`` until it is finished): the
        registrant's scores, kept for the record, its own tags, the weights digest, the run and the commit (a tag
        of its own under those names wins)."""
        tags = {
            TAG_STSB_DEV: f"{float(self.stsb_dev):.6f}",
            TAG_STS: json.dumps({k: round(float(v), 6) for k, v in self.sts_all.items()}, sort_keys=True),
            **{k: str(v) for k, v in (self.tags or {}).items()},
            TAG_STATE: REGISTERING,
        }
        if self.weights_sha256:
            tags[TAG_WEIGHTS] = self.weights_sha256
        for key, value in (("run_id", run_id), ("git_commit", commit)):
            if value:
                tags.setdefault(key, value)
        return tags


@dataclass(frozen=True)
class PipelineShape:
    """What production serves, as the gate loaded it: the modules in order (``modules.json`` types, and the
    sentcl pooling a folder carries), the size of a vector, and whether vectors come out at unit length."""

    modules: tuple[str, ...]
    dimension: int
    normalized: bool

    def describe(self) -> str:
        names = " > ".join(m.rpartition(".")[2] for m in self.modules)
        return f"{names} ({self.dimension}-d, {'unit length' if self.normalized else 'not normalised'})"


def pipeline_shape(folder: Path, vectors: Any) -> PipelineShape:
    """The modules ``folder`` lists (types, in order; a carried sentcl pooling last) and what ``vectors`` (the
    served encoding of ``PROBE``) show: their size and whether every one is of unit length."""
    import numpy as np

    listed = json.loads((folder / "modules.json").read_text()) if (folder / "modules.json").is_file() else []
    modules = [str(m.get("type", "?")) for m in listed if isinstance(m, dict)]
    carried = folder / "sentcl_pooling.json"
    if carried.is_file():
        modules.append(f"sentcl_pooling:{json.loads(carried.read_text()).get('pooling')}")
    array = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(array.reshape(len(array), -1), axis=1)
    dimension = int(array.shape[1]) if array.ndim == 2 else 0
    return PipelineShape(tuple(modules), dimension, bool(np.allclose(norms, 1.0, atol=1e-3)))


def pipeline_change(candidate: PipelineShape | None, champion: PipelineShape | None) -> str | None:
    """Why the candidate serves a different kind of pipeline from the champion (other modules, another vector size,
    normalised or not), or None when it is the same kind (or either is unknown: no champion, a caller's own
    scorer on a folder that does not load). Callers of the served model
    rely on these: a change is a refusal unless an operator allows it (``promote --allow-pipeline-change``)."""
    if candidate is None or champion is None or candidate == champion:
        return None
    parts = []
    if candidate.modules != champion.modules:
        parts.append("its modules differ")
    if candidate.dimension != champion.dimension:
        parts.append(f"its vectors have {candidate.dimension} dimensions, not {champion.dimension}")
    if candidate.normalized != champion.normalized:
        parts.append(
            "it normalises its vectors" if candidate.normalized else "it does not normalise its vectors"
        )
    return (
        f"the served pipeline changes ({'; '.join(parts)}): {candidate.describe()} against the champion's "
        f"{champion.describe()}"
    )


# --------------------------------------------------------------------------------------------- scores


def dev_scores(row: Mapping[str, Any]) -> dict[str, float]:
    """The gate's dev guards from one checkpoint's row of metrics/sts.json (those it has)."""
    return {key: float(row[key]) for key in DEV_GUARDS if row.get(key) is not None}


def sts_row_from_tags(tags: Mapping[str, str] | None) -> dict[str, Any]:
    """A version's scores as a row of metrics/sts.json (``all``: the seven test tasks, for the record;
    ``stsb_dev`` and the dev guards it has), so a registered champion can stand beside fresh candidates."""
    scores = Scores.from_tags(tags)
    table = json.loads((tags or {}).get(TAG_STS) or "{}")
    return {"all": {k: float(v) for k, v in table.items()}, "stsb_dev": scores.stsb_dev, **scores.guards}


def weight_file_digests(folder: Path) -> dict[str, str]:
    """sha256 of each weight file of a sentence-transformers folder (safetensors, else .bin): those at its top
    (the transformer), keyed by name, and those of every other module ``modules.json`` lists (a ``Dense``
    head), keyed ``<module path>/<name>``, so that one transformer under two heads is two sets of weights.
    Folders no module names (``onnx/``, ``openvino/``) are not weights of this pipeline."""
    folder = Path(folder)
    digests = {path.name: file_sha256(path) for path in _weight_files(folder)}
    for module in _module_paths(folder):
        for path in _weight_files(folder / module):
            digests[f"{module}/{path.name}"] = file_sha256(path)
    return digests


def _weight_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))


def _module_paths(folder: Path) -> list[str]:
    """The sub-folders modules.json names (not the top, not one outside the folder); [] without the file."""
    try:
        modules = json.loads((folder / "modules.json").read_text())
    except (OSError, ValueError):
        return []
    paths = {m.get("path") for m in modules if isinstance(m, dict)} if isinstance(modules, list) else set()
    root = folder.resolve()
    return sorted(
        p
        for p in paths
        if isinstance(p, str) and p and (folder / p).resolve().parent == root and (folder / p).is_dir()
    )


def weights_fingerprint(per_file: Mapping[str, str]) -> str:
    """One sha256 for a model's weights from the sha256 of each weight file (name -> hex digest)."""
    if not per_file:
        raise ValueError("no weight files to fingerprint")
    return hashlib.sha256(json.dumps(dict(sorted(per_file.items()))).encode()).hexdigest()


# --------------------------------------------------------------------------------------------- gate


def version_weights(tags: Mapping[str, str]) -> str | None:
    """A version's weights fingerprint: its own tag, or derived from the per-file digests of older versions."""
    if tags.get(TAG_WEIGHTS):
        return tags[TAG_WEIGHTS]
    try:
        per_file = json.loads(tags.get("weights_sha256") or "{}")
        return weights_fingerprint(per_file) if per_file else None
    except (ValueError, TypeError):
        return None


def promotion_blocked(
    candidate_tags: Mapping[str, str], rolled_back_weights: set[str], forced_by: str | None
) -> str | None:
    """Why a version may not be promoted at all (it, or a version with the same weights, was rolled back),
    or None. An explicit ``--force`` by a named person lifts the rolled-back block, never a refusal: the files
    of a refused version differ from what was registered."""
    if candidate_tags.get(TAG_STATE) == REFUSED:
        return (
            f"the gate refused this version ({candidate_tags.get(TAG_REFUSED) or 'no reason recorded'}); "
            "it is never promoted: register the model again"
        )
    if forced_by:
        return None
    if str(candidate_tags.get(TAG_ROLLED_BACK, "")).lower() == "true":
        return (
            "this version was rolled back "
            f"({candidate_tags.get('rolled_back_reason', 'no reason recorded')}); "
            "promote it again only with --force --by NAME"
        )
    digest = version_weights(candidate_tags)
    if digest and digest in rolled_back_weights:
        return (
            f"its weights (sha256 {digest[:12]}) are those of a rolled-back version; "
            "promote them again only with --force --by NAME"
        )
    return None


def gate_decision(
    challenger: Scores, champion: Scores | None, config: GateConfig, use_domain: bool = True
) -> tuple[bool, list[str]]:
    """(promote?, reasons). Scores are Spearman x 100, of dev splits only (no test set takes part).

    - no champion yet: promote (the first model ever registered);
    - STS-B dev must beat the champion's by ``min_delta`` -- or, when both carry a domain score, the domain
      Spearman must beat the champion's by ``min_domain_delta`` while STS-B dev does not fall by more than
      ``max_dev_drop``;
    - no dev guard (SICK-R trial, ``DEV_GUARDS``) and no domain score may drop by more than ``max_dev_drop``;
      a guard the champion has no score for (registered before it was recorded) is said, not compared.
    """
    min_delta, max_dev_drop = config.min_delta, config.max_dev_drop
    c_stsb, c_table, c_domain = challenger.stsb_dev, challenger.guards, challenger.domain
    if c_stsb is None:
        return False, ["challenger has no stsb_dev score"]
    if math.isnan(c_stsb):  # every pair at the same similarity: the model ranks nothing
        return False, ["challenger's stsb_dev is undefined (its similarities are constant)"]
    if champion is None:
        return True, [f"no champion yet: the first model becomes champion (stsb_dev {c_stsb:.2f})"]
    k_stsb, k_table, k_domain = champion.stsb_dev, champion.guards, champion.domain
    if k_stsb is None:
        return True, ["champion has no stsb_dev score recorded; any scored challenger replaces it"]
    reasons: list[str] = []
    delta = c_stsb - k_stsb
    stsb_ok = delta >= min_delta
    reasons.append(
        f"stsb_dev {c_stsb:.2f} vs champion {k_stsb:.2f}: delta {delta:+.2f} "
        f"{'>=' if stsb_ok else '<'} min_delta {min_delta:.2f}"
    )
    gain_ok = stsb_ok
    if use_domain and c_domain is not None and k_domain is not None:
        d_delta = c_domain - k_domain
        domain_ok = d_delta >= config.min_domain_delta
        reasons.append(
            f"domain spearman {c_domain:.2f} vs champion {k_domain:.2f}: delta {d_delta:+.2f} "
            f"{'>=' if domain_ok else '<'} min_domain_delta {config.min_domain_delta:.2f}"
        )
        if -d_delta > max_dev_drop:
            reasons.append(f"domain spearman drops {-d_delta:.2f} > max_dev_drop {max_dev_drop:.2f}")
            return False, reasons
        if domain_ok and not stsb_ok:
            if -delta > max_dev_drop:
                reasons.append(f"stsb_dev drops {-delta:.2f} > max_dev_drop {max_dev_drop:.2f}")
                return False, reasons
            reasons.append("domain gain accepted: STS-B dev holds within max_dev_drop")
            gain_ok = True
    drops: dict[str, float] = {}
    for guard in sorted(set(c_table) | set(k_table)):
        if guard not in c_table:
            reasons.append(f"challenger has no {guard} score")
            drops[guard] = math.inf
        elif guard not in k_table:
            reasons.append(f"champion has no {guard} score recorded: not compared")
        elif k_table[guard] - c_table[guard] > max_dev_drop:
            drops[guard] = k_table[guard] - c_table[guard]
            reasons.append(f"{guard} drops {drops[guard]:.2f} > max_dev_drop {max_dev_drop:.2f}")
    if not drops:
        reasons.append(f"no dev guard drops more than {max_dev_drop:.2f}")
    return gain_ok and not drops, reasons
