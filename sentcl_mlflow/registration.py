"""A release folder (``sentcl.registry.release``) registered: the pyfunc model run, ``challenger``, the gate.

The one home of registration: the `register` stage (``stages.register``, the DVC stage and the retrain flow's
last step) is its only caller; `export` builds the folder and registers nothing."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sentcl.registry.rules import TAG_DEV, TAG_DOMAIN, GateConfig

# The code MLflow serves an exported folder with (logged as "models from code", see that file).
PYFUNC_MODEL = Path(__file__).with_name("pyfunc_encoder.py")

INPUT_EXAMPLE = ["a sentence", "another one"]


@dataclass(frozen=True)
class Release:
    """A release folder (``sentcl.registry.release``) as the registry gets it: ``folder``, its ``info``
    (export.json), the STS row of its checkpoint (``sts_row``: metrics/sts.json), the data ``inputs`` its run
    records the DVC hashes of, the ``tags`` of its run and version, and the code MLflow serves it with
    (``model_file``)."""

    folder: Path
    info: Mapping[str, Any]
    sts_row: Mapping[str, Any]
    model_file: Path
    inputs: Sequence[Path] = ()
    tags: Mapping[str, str] = field(default_factory=dict)


def log_and_register(
    release: Release,
    params: Mapping[str, Any],
    gate: bool,
    actor: str | None = None,
    *,
    dev_pairs: Path | None = None,
    domain_dev: Path | None = None,
) -> dict[str, Any]:
    """Register ``release`` as ``challenger`` and run the gate, as one unit under the promotion lease.

    The MLflow run `export` (the folder as a pyfunc model served by ``release.model_file``) is logged only when
    no version of the model holds these weights yet (same sha256): the same weights are never registered twice,
    whoever retries. ``params``: the process's, as its entry point read them (its requests are bounded by then,
    ``store.bound_requests``). The gate scores the candidate and the champion itself on ``dev_pairs`` (the
    validate stage's pairs.parquet) and ``domain_dev`` (the domain's scored pairs, when given).
    """
    from sentcl.model.encoder import load_folder_encoder
    from sentcl.registry.rules import Registration
    from sentcl_mlflow import runs
    from sentcl_mlflow.registry.gate import register_and_gate
    from sentcl_mlflow.registry.gatekeeper import TAG_GATE_INPUTS, gate_inputs_tag
    from sentcl_mlflow.registry.measure import Evidence
    from sentcl_mlflow.registry.names import run_experiment

    output, info, sts_row, tags = release.folder, release.info, release.sts_row, release.tags
    timings: dict[str, float] = {}
    # The registrar (make serve's flows) registers a candidate and asks the gate process: no gate here. The
    # domain (or teacher-agreement) pairs go with the candidate's run, their digest on the version.
    candidate = info["model_name"] == GateConfig.from_params(params).candidate_model_name
    gate_inputs = {TAG_GATE_INPUTS: gate_inputs_tag(domain_dev)} if candidate and domain_dev else {}

    def log_model() -> tuple[str, str]:
        started = time.time()
        example_vectors = load_folder_encoder(output, device="cpu").encode(INPUT_EXAMPLE)  # its own pooling
        metrics = runs.sts_metrics(sts_row)
        metrics["onnx_max_abs_diff"] = info["onnx"]["max_abs_diff_vs_pytorch"]
        model = runs.PyfuncModel(
            release.model_file, {"encoder": output}, INPUT_EXAMPLE, example_vectors, pip_requirements()
        )
        record = runs.StageRecord(
            metrics,
            inputs=release.inputs,
            tags={**tags, "checkpoint": info["checkpoint"], "beat_init": str(info["beat_init"]).lower()},
        )
        # production runs go to the gate-only experiment (names.run_experiment)
        experiment = run_experiment(info["model_name"], GateConfig.from_params(params))
        run_id, model_uri = runs.log_pyfunc_run("export", params, model, record, experiment)
        if gate_inputs:
            log_gate_inputs(run_id, Path(domain_dev))
        timings["seconds_log_model"] = round(time.time() - started, 2)
        return model_uri, run_id

    started = time.time()
    registration = Registration(
        log_model,
        info["stsb_dev"],
        info["sts_all"],
        name=info["model_name"],
        tags={
            "checkpoint": info["checkpoint"],
            "beat_init": str(info["beat_init"]).lower(),
            "trained_beat_init": str(info.get("trained_beat_init", False)).lower(),
            "weights_sha256": json.dumps(info["weights_sha256"]),
            TAG_DEV: json.dumps(info.get("dev_scores") or {}, sort_keys=True),
            **(
                {TAG_DOMAIN: f"{sts_row['domain_spearman']:.6f}"}
                if sts_row.get("domain_spearman") is not None
                else {}
            ),
            **{k: v for k, v in tags.items() if not k.startswith("mlflow.")},
            **gate_inputs,
        },
        weights_sha256=info["weights_fingerprint"],
    )
    evidence = Evidence(dev_pairs, domain_dev)
    outcome = register_and_gate(registration, params, evidence, actor, gate=gate and not candidate)
    result: dict[str, Any] = {
        **outcome,
        **timings,
        "seconds_register_and_gate": round(time.time() - started - timings.get("seconds_log_model", 0), 2),
    }
    verb = "registered" if outcome["created"] else "found"
    print(
        f"register: {verb} {info['model_name']} version {outcome['version']} as challenger "
        f"({info['checkpoint']}); register+gate {result['seconds_register_and_gate']}s"
    )
    if candidate and gate:
        result.update(_await_gate(info["model_name"], outcome["version"], params))
    return result


def log_gate_inputs(run_id: str, domain_dev: Path) -> None:
    import shutil
    import tempfile

    from sentcl_mlflow.registry.gatekeeper import DOMAIN_DEV_ARTIFACT
    from sentcl_mlflow.store import client

    folder, file_name = DOMAIN_DEV_ARTIFACT.rsplit("/", 1)
    with tempfile.TemporaryDirectory(prefix="sentcl-gate-inputs-") as tmp:
        shutil.copyfile(domain_dev, Path(tmp) / file_name)
        client().log_artifact(run_id, str(Path(tmp) / file_name), folder)


def _await_gate(name: str, version: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The gate process's verdict on the candidate (bounded by params flows.gate_wait_s): printed, and returned
    as the ``gate`` of the result; no verdict in time is one line, not a failure."""
    from sentcl.params import FlowConfig
    from sentcl_mlflow.registry.gatekeeper import wait_for_verdict

    wait_s = FlowConfig.from_params(params).gate_wait_s
    print(f"register: asked the gate process to judge {name} version {version}; waiting up to {wait_s:g}s")
    found = wait_for_verdict(name, version, wait_s)
    if found is None:
        print(
            f"register: no verdict from the gate process on {name} version {version} within {wait_s:g}s; "
            "it will tag the version (gate.decision) when it has judged it"
        )
        return {}
    print(f"register: the gate's verdict on {name} version {version}: {found['decision'].upper()}")
    for reason in found["reasons"]:
        print(f"  - {reason}")
    return {"gate": found}


def pip_requirements() -> list[str]:
    """Pinned from this environment; MLflow's inference would load the model again just to find imports."""
    from importlib.metadata import version

    return [
        f"{name}=={version(name)}"
        for name in (
            "mlflow",
            "sentence-transformers",
            "transformers",
            "torch",
            "numpy",
            "pandas",
            "onnxruntime",
        )
    ]


def registry_summary(result: dict[str, Any]) -> dict[str, Any]:
    """The registry's part of a stage's summary: which version, whether new, what the gate decided."""
    summary: dict[str, Any] = {
        "registered_model": result["model"],
        "registered_version": result["version"],
        "new_version": result["created"],
    }
    if "gate" in result:
        summary["gate"] = {k: result["gate"][k] for k in ("decision", "reasons", "champion_after")}
    return summary
