"""params.yaml as DVC writes it: `dvc exp run -S transfer.lr=1e-5` stores `1e-05`, a string to YAML 1.1."""

from __future__ import annotations

import pytest
import yaml

from sentcl.params import load_yaml


def test_a_value_set_by_dvc_exp_run_reaches_the_stage_as_a_float(tmp_path, monkeypatch):
    from dvc.utils.hydra import apply_overrides  # what `dvc exp run -S` calls on params.yaml

    from stages.common import load_params

    path = tmp_path / "params.yaml"
    path.write_text("transfer:\n  lr: 2.0e-5\n  steps: 30\n")
    apply_overrides(str(path), ["transfer.lr=1e-5"])
    assert "1e-05" in path.read_text()
    assert yaml.safe_load(path.read_text())["transfer"]["lr"] == "1e-05"  # the bug this module exists for
    params = load_params(path)
    assert params["transfer"] == {"lr": 1e-05, "steps": 30}
    assert isinstance(params["transfer"]["steps"], int)


@pytest.mark.parametrize(
    "text,value",
    [
        ("1e-05", 1e-05),
        ("1E5", 1e5),
        ("-2e+3", -2000.0),
        (".5e-1", 0.05),
        ("3.0e-6", 3e-6),
        ("30", 30),
        ("'1e-5'", "1e-5"),  # quoted: the user asked for text
        ("1e", "1e"),
        ("e5", "e5"),
        ("true", True),
        ("null", None),
    ],
)
def test_yaml_1_2_floats_and_nothing_else_changes(text, value):
    loaded = load_yaml(f"x: {text}\n")["x"]
    assert loaded == value and type(loaded) is type(value)


def test_one_reader_names_the_file_and_line_of_a_bad_params_file(tmp_path):
    from sentcl.params import ParamsError, read_params

    with pytest.raises(ParamsError, match=r"^.*missing\.yaml: no such params file$"):
        read_params(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("seed: 1\ntransfer:\n  lr: [1, 2\n")
    with pytest.raises(ParamsError, match=r"bad\.yaml:4: not valid YAML"):
        read_params(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ParamsError, match="must be a mapping of sections, got list"):
        read_params(bad)


def test_overrides_are_read_as_dvc_exp_run_reads_them(tmp_path):
    """`--set` takes DVC's `-S` syntax and writes the same values DVC's own function writes into the file."""
    from dvc.utils.hydra import apply_overrides

    from sentcl.params import read_params

    text = "transfer:\n  lr: 2.0e-5\n  steps: 30\n  base: {views: [none, none]}\nseed: 42\n"
    overrides = ["transfer.lr=1e-5", "seed=7", "transfer.base.views=[shuffle,none]", "+transfer.base.steps=9"]
    (tmp_path / "ours.yaml").write_text(text)
    (tmp_path / "dvc.yaml").write_text(text)
    apply_overrides(str(tmp_path / "dvc.yaml"), overrides)
    ours = read_params(tmp_path / "ours.yaml", overrides)
    assert dict(ours) == dict(read_params(tmp_path / "dvc.yaml"))
    assert ours["transfer"]["base"] == {"views": ["shuffle", "none"], "steps": 9}
    assert ours.overrides == tuple(overrides)
    assert (tmp_path / "ours.yaml").read_text() == text  # the file itself is never written


@pytest.mark.parametrize(
    "override,message",
    [
        ("transfer.lrr=1", "no key 'transfer.lrr' (+transfer.lrr=... adds one)"),
        ("trainer.lr=1", "no key 'trainer'"),
        ("transfer.lr", "is not key=value"),
    ],
)
def test_an_override_that_names_no_key_is_one_line_naming_it(tmp_path, override, message):
    from sentcl.params import ParamsError, read_params

    (tmp_path / "params.yaml").write_text("transfer:\n  lr: 2.0e-5\n")
    with pytest.raises(ParamsError) as error:
        read_params(tmp_path / "params.yaml", [override])
    assert str(error.value) == f"{tmp_path / 'params.yaml'}: override {override!r}" + (
        f" {message}" if message.startswith("is ") else f": {message}"
    )


def test_merge_is_key_by_key_none_leaves_a_mapping_and_nothing_is_shared():
    from sentcl.params import merge

    base = {"view": {"span": 0.1, "saved": {"a": 1}}, "lr": 1.0, "views": ["none", "none"], "head_lr": 1e-3}
    over = {"view": {"saved": {"b": 2}}, "lr": 2.0, "head_lr": None, "views": ["shuffle"]}
    out = merge(base, over)
    assert out == {
        "view": {"span": 0.1, "saved": {"a": 1, "b": 2}},
        "lr": 2.0,
        "views": ["shuffle"],
        "head_lr": None,
    }
    assert merge(base, {"view": None}) == base  # a section that says nothing of a mapping leaves it
    out["view"]["saved"]["a"] = 9
    out["views"].append("x")
    assert base["view"]["saved"]["a"] == 1 and over["views"] == ["shuffle"]


def test_a_stage_command_carries_the_same_file_and_overrides(tmp_path):
    import sys

    from sentcl.params import ROOT, read_params

    own = tmp_path / "exp.yaml"
    own.write_text("transfer:\n  lr: 2.0e-5\n")
    params = read_params(own, ["transfer.lr=1e-5"])
    options = {
        "--init": "base",
        "--steps": 40,
        "--domain-dev": None,
        "--no-progress": True,
        "--model": ["a", "b"],
    }
    assert params.command("stages.transfer", options) == [
        sys.executable, "-m", "stages.transfer", "--params", str(own), "--set", "transfer.lr=1e-5",
        "--init", "base", "--steps", "40", "--no-progress", "--model", "a", "--model", "b",
    ]  # fmt: skip
    overlaid = params.overlaid(["+retrain.x=1"])
    assert overlaid.command("stages.teacher")[3:] == [
        "--params", str(own), "--set", "transfer.lr=1e-5", "--set", "+retrain.x=1",
    ]  # fmt: skip
    assert overlaid["retrain"] == {"x": 1} and "retrain" not in params
    # The checkout's own params.yaml is what a stage reads without --params: it is not named.
    assert read_params().command("stages.evaluate") == [sys.executable, "-m", "stages.evaluate"]
    assert read_params(ROOT / "params.yaml").command("stages.evaluate")[3:] == []
