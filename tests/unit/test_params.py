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
