"""One resolver (sentcl.training.recipes) says which params.yaml sections a training run's settings come from: the
transfer stage builds its config from it and the report reads it, so the report names what trained.

The params here are built by hand with params.yaml's shape; the expected values follow its rules: the objective
is the command line's, else the recipe's (not with a preset asked for), else ``transfer.objective``; objective
distill adds ``transfer.distillation`` over the recipe, tsdae adds ``transfer.tsdae``; later sections win, and
``view``/``distill`` merge key by key."""

from __future__ import annotations

import pytest

from sentcl.training import recipes


def params() -> dict:
    return {
        "seed": 7,
        "model": {"name": "tiny", "max_length": 32},
        "train": {
            "lr": 1.0e-5,
            "steps": 100,
            "batch_size": 16,
            "view": {"feature_cutoff": 0.0, "token_shuffle": 0.0},
            "distill": {"loss": "similarity_mse", "examples": "sentences", "weight": 1.0},
        },
        "pretrain_nli": {"objective": "ce", "lr": 3.0e-5},
        "joint": {"objective": "ce", "lr": 4.0e-5},
        "transfer": {
            "objective": "contrastive",
            "texts": "heldout",
            "max_texts": "all",
            "steps": 30,
            "lr": 2.0e-5,
            "base": {
                "objective": "distill",
                "views": ["feature_cutoff", "shuffle"],
                "view": {"feature_cutoff": 0.2},
            },
            "nli": {"views": ["none", "feature_cutoff"], "view": {"feature_cutoff": 0.1}},
            "joint": {"views": ["none", "shuffle"]},
            "distillation": {"distill": {"examples": "neighbours"}, "lr": 1.0e-4, "steps": 150},
            "tsdae": {"lr": 3.0e-5, "batch_size": 8},
        },
        "teacher": {"model": "all-mpnet-base-v2"},
    }


@pytest.mark.parametrize(
    ("recipe", "overrides", "objective"),
    [
        ("base", {}, "distill"),  # the recipe's own
        ("nli", {}, "contrastive"),  # no recipe objective: the section's
        ("base", {"objective": "tsdae"}, "tsdae"),  # the command line wins
        ("base", {"preset": "simcse"}, "contrastive"),  # a preset is contrastive: not the recipe's distill
        ("base", {"preset": "simcse", "objective": "tsdae"}, "tsdae"),
        (None, {}, "contrastive"),
    ],
)
def test_the_objective_of_a_transfer_run(recipe, overrides, objective):
    assert recipes.transfer_objective(params(), recipe, overrides) == objective


def test_a_distilled_recipe_adds_the_distillation_section_over_its_own():
    settings = recipes.checkpoint_settings(params(), "transfer-base")
    assert settings["mode"] == "transfer" and settings["objective"] == "distill"
    assert settings["lr"] == 1.0e-4 and settings["steps"] == 150  # transfer.distillation over transfer
    assert settings["batch_size"] == 16  # from train: no later section sets it
    assert settings["views"] == ["feature_cutoff", "shuffle"]
    assert settings["view"] == {"feature_cutoff": 0.2, "token_shuffle": 0.0}  # key by key
    assert settings["distill"] == {"loss": "similarity_mse", "examples": "neighbours", "weight": 1.0}
    assert settings["seed"] == 7 and settings["max_length"] == 32
    for stage_key in ("texts", "max_texts", "base", "nli", "joint", "tsdae", "distillation"):
        assert stage_key not in settings  # the stage reads those itself


def test_a_contrastive_recipe_takes_the_section_and_its_own_values():
    settings = recipes.checkpoint_settings(params(), "transfer-nli")
    assert settings["objective"] == "contrastive"
    assert settings["lr"] == 2.0e-5 and settings["steps"] == 30
    assert settings["view"] == {"feature_cutoff": 0.1, "token_shuffle": 0.0}


def test_tsdae_adds_its_section_and_the_command_line_wins_over_all():
    merged = recipes.merged(recipes.transfer_sections(params(), "nli", {"objective": "tsdae", "steps": 5}))
    assert merged["objective"] == "tsdae"
    assert merged["lr"] == 3.0e-5 and merged["batch_size"] == 8  # transfer.tsdae
    assert merged["steps"] == 5  # the command line
    assert merged["views"] == ["none", "feature_cutoff"]  # the recipe, under the tsdae section
    names = [name for name, _ in recipes.transfer_sections(params(), "nli", {"objective": "tsdae"})]
    assert names == ["top level", "train", "transfer", "transfer.nli", "transfer.tsdae", "command line"]


def test_the_nli_and_joint_checkpoints_read_their_own_sections():
    nli = recipes.checkpoint_settings(params(), "nli")
    assert (nli["mode"], nli["objective"], nli["lr"], nli["steps"]) == ("nli", "ce", 3.0e-5, 100)
    joint = recipes.checkpoint_settings(params(), "joint")
    assert (joint["mode"], joint["lr"]) == ("joint", 4.0e-5)


def test_a_preset_in_the_section_sets_its_published_values():
    p = params()
    p["transfer"]["preset"] = "promptbert"
    p["transfer"]["nli"]["temperature"] = 0.1
    settings = recipes.checkpoint_settings(p, "transfer-nli")
    assert settings["objective"] == "promptbert"  # PromptBERT's own objective
    assert settings["temperature"] == 0.05 and settings["loss"] == "info_nce"  # over the recipe's
    assert settings["lr"] == 2.0e-5  # a preset leaves the lr alone


@pytest.mark.parametrize(
    ("init", "stage", "recipe", "expected"),
    [
        ("base", None, None, ("transfer-base", "base")),
        ("joint", None, None, ("transfer-joint", "joint")),
        ("/models/from-the-registry", None, None, ("transfer-custom", "base")),
        ("/models/x", "transfer-x", "nli", ("transfer-x", "nli")),
    ],
)
def test_the_stage_name_and_recipe_of_a_transfer(init, stage, recipe, expected):
    assert recipes.transfer_run(init, stage, recipe) == expected


def test_the_report_and_the_stage_resolve_the_same_settings():
    """The project's params.yaml: the config each transfer stage builds has the lr and objective the report
    names for its checkpoint."""
    from stages.common import load_params
    from stages.transfer import transfer_config

    project = load_params()
    for recipe in recipes.INIT_NAMES:
        config = transfer_config(project, recipe, {})
        settings = recipes.checkpoint_settings(project, f"transfer-{recipe}")
        assert (config.objective, config.lr, config.steps) == (
            settings["objective"],
            settings["lr"],
            settings["steps"],
        )
        assert config.distill.examples == settings["distill"]["examples"]
