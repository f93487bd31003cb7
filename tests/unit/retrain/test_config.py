"""params.yaml ``retrain:`` read once (sentcl.retrain.config): the method, the teacher a distill method needs,
the held-out share, and ``retrain.transfer`` over ``transfer:`` (a retrain's distill steps)."""

from __future__ import annotations

import pytest
import yaml

from tests.paths import ROOT


def test_a_retrain_distill_run_trains_retrain_transfer_steps_and_the_other_objectives_their_recipe():
    from sentcl.params import ParamsError, apply_overrides
    from sentcl.retrain.config import retrain_overrides
    from stages.check_params import check
    from stages.transfer import transfer_config

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    overlay = params["retrain"]["transfer"]["distillation"]["steps"]
    # the whole domain text (the pipeline samples its own), a nightly budget of steps, every layer trained at
    # one rate (as the nightly path was measured)
    assert retrain_overrides(params) == [
        'transfer.max_texts="all"',
        f"transfer.distillation.steps={overlay}",
        "transfer.distillation.freeze=[]",
        "transfer.distillation.lr=0.0002",
        "transfer.distillation.layer_lr_decay=1.0",
    ]
    retrain = apply_overrides(params, retrain_overrides(params))
    steps = {
        o: transfer_config(retrain, "base", {"objective": o}).steps
        for o in ("distill", "contrastive", "tsdae")
    }
    assert steps == {
        "distill": overlay,
        "contrastive": params["transfer"]["steps"],
        "tsdae": params["transfer"]["steps"],
    }
    assert overlay != params["transfer"]["distillation"]["steps"]  # a budget of its own
    # the pipeline's distillation leaves its bottom layers untrained; a retrain trains every layer
    assert transfer_config(params, "base", {"objective": "distill"}).freeze
    assert transfer_config(retrain, "base", {"objective": "distill"}).freeze == ()
    pipeline = transfer_config(params, "base", {"objective": "distill"})
    nightly = transfer_config(retrain, "base", {"objective": "distill"})
    assert pipeline.layer_lr_decay < 1 and (nightly.layer_lr_decay, nightly.lr) == (1.0, 2e-4)
    for bad in (0, 2.5, True, "600"):
        bad_params = {
            **params,
            "retrain": {**params["retrain"], "transfer": {"distillation": {"steps": bad}}},
        }
        with pytest.raises(ParamsError, match=r"^params.yaml: retrain.transfer: steps: "):
            check(bad_params)
    unknown = {**params, "retrain": {**params["retrain"], "transfer": {"distillation": {"stepz": 600}}}}
    with pytest.raises(
        ParamsError, match="retrain.transfer.distillation.stepz: transfer.distillation.stepz is not"
    ):
        retrain_overrides(unknown)
    rest = {k: v for k, v in params["retrain"].items() if k != "transfer"}
    with pytest.raises(ParamsError, match="retrain.transfer is missing"):
        retrain_overrides({**params, "retrain": rest})


def test_retrain_config_is_read_once_from_retrain_and_a_bad_value_names_its_key():
    from sentcl.params import ParamsError
    from sentcl.retrain.config import RETRAIN_METHODS, RetrainConfig

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    config = RetrainConfig.from_params(params)
    assert (
        config.method == params["retrain"]["method"] and config.objectives == RETRAIN_METHODS[config.method]
    )
    assert config.teacher == params["teacher"]["model"]  # the default method distils
    assert config.agreement.heldout_share == params["retrain"]["heldout_share"]
    assert config.agreement.gate_share == params["retrain"]["gate_share"]
    assert config.overrides == (
        'transfer.max_texts="all"',
        "transfer.distillation.steps=600",
        "transfer.distillation.freeze=[]",
        "transfer.distillation.lr=0.0002",
        "transfer.distillation.layer_lr_decay=1.0",
    )
    assert RetrainConfig.from_params(params, "tsdae+contrastive").objectives == ("tsdae", "contrastive")
    assert RetrainConfig.from_params(params, "tsdae").teacher is None
    for change, message in (
        ({"method": "tsdae+magic"}, "retrain.method 'tsdae+magic' is not one of"),
        ({"heldout_share": 1.5}, "retrain.heldout_share must be below 1"),
        ({"heldout_max": 3}, "retrain.heldout_max must be a whole number >= 20"),
        ({"gate_share": 1.0}, "retrain.gate_share must be below 1"),
        ({"gate_share": 0}, "retrain.gate_share"),
        ({"transfer": [1]}, "retrain.transfer must be a mapping over transfer:"),
        ({"steps": 3}, "unknown key 'steps' in section 'retrain'"),
    ):
        with pytest.raises(ParamsError, match=message.replace("+", r"\+")):
            RetrainConfig.from_params({**params, "retrain": {**params["retrain"], **change}})
    with pytest.raises(
        ParamsError, match=r"retrain.method distill distils from a teacher but teacher.model is none"
    ):
        RetrainConfig.from_params({**params, "teacher": {**params["teacher"], "model": "none"}})
