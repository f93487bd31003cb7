"""A flow's timeout and its stage tasks' retries come from the params its run read, overrides included: the
functions that build the configured flows, on real Prefect objects (no server needed), and the command lines
that feed them."""

from __future__ import annotations

import pytest
import yaml
from prefect import Flow
from prefect.cache_policies import NO_CACHE

from flows import common, pipeline, promote, retrain
from sentcl.params import FlowConfig, read_params
from tests.paths import ROOT


def test_set_reaches_the_retrain_flows_timeout_and_its_stages_retries():
    settings = read_params(None, ["flows.flow_timeout_s=321", "flows.retries=5", "flows.retry_delay_s=7"])
    configured = retrain.configured(settings)
    assert isinstance(configured, Flow) and configured.name == "sentcl-retrain"
    assert configured.timeout_seconds == 321
    assert configured.fn is retrain.run_retrain.fn  # the same body, bounded
    config = FlowConfig.from_params(settings)
    for task in (retrain.stage, retrain.fetch_init):
        retried = common.retried(task, config)
        assert (retried.retries, retried.retry_delay_seconds) == (5, 7)
        assert retried.retry_condition_fn is common.retry_if_transient  # still only the transient way
        assert retried.cache_policy is NO_CACHE
        assert task.retries == 0  # the decorated task itself is left as it was


def test_a_params_file_reaches_the_flows_and_zero_means_no_timeout(tmp_path):
    values = yaml.safe_load((ROOT / "params.yaml").read_text())
    values["flows"] |= {"flow_timeout_s": 0, "stage_timeout_s": 99, "retries": 1}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(values))
    settings = read_params(path)
    config = FlowConfig.from_params(settings)
    assert retrain.configured(settings).timeout_seconds is None
    assert pipeline.configured(config).timeout_seconds is None
    gate, back = promote.configured(config, rollback=False), promote.configured(config, rollback=True)
    assert (gate.name, gate.timeout_seconds) == ("sentcl-promote", 99)  # a gate run is bounded like a stage
    assert (back.name, back.timeout_seconds) == ("sentcl-rollback", 99)
    assert common.retried(pipeline.repro, config).retries == 1


def test_the_pipeline_takes_flows_keys_only():
    config = pipeline.flow_settings(["flows.flow_timeout_s=60", "flows.retries=0"])
    assert pipeline.configured(config).timeout_seconds == 60
    assert common.retried(pipeline.repro, config).retries == 0
    with pytest.raises(ValueError, match="only flows.\\* keys"):
        pipeline.flow_settings(["transfer.lr=1e-5"])


@pytest.mark.parametrize(
    "main, argv",
    [
        (pipeline.main, ["--set", "flows.retries=-1"]),
        (pipeline.main, ["--stage-timeout", "-5"]),
        (retrain.main, ["--domain-text", "text.txt", "--set", "flows.flow_timeout_s=soon"]),
        (promote.main, ["--set", "flows.retries=many"]),
        (promote.rollback_main, ["--set", "flows.nope=1"]),
    ],
)
def test_a_bad_flows_value_on_the_command_line_is_one_line_exit_2(main, argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "text.txt").write_text("one sentence here\nand another one there\n")
    assert exit_code(main, argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "flows." in err, err


def exit_code(main, argv) -> int:
    """A main's exit code, returned or raised (argparse and ``fail`` raise SystemExit)."""
    try:
        return main(argv)
    except SystemExit as done:
        return done.code


def test_the_deployments_entry_points_are_flows_bounded_at_run_time():
    """infra/prefect.yaml's entry points load as flows; their timeout is applied when the run starts (the
    configured flow above, as their subflow), never fixed when the module was imported."""
    from prefect.flows import load_flow_from_entrypoint

    entries = {
        d["entrypoint"] for d in yaml.safe_load((ROOT / "infra/prefect.yaml").read_text())["deployments"]
    }
    assert entries == {"flows/retrain.py:retrain", "flows/pipeline.py:pipeline"}
    for entry in sorted(entries):
        loaded = load_flow_from_entrypoint(str(ROOT / entry))
        assert isinstance(loaded, Flow) and loaded.timeout_seconds is None
