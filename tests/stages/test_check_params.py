"""params.yaml is checked, all of it, before any stage's outputs are removed: `dvc exp run -S transfer.lr=fast`
stops at the check_params stage with one line, and the outputs of the stage it would have rerun keep their bytes."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stages import check_params
from tests.paths import ROOT

PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text())
DVC_STAGES = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


def run_check(tmp_path: Path, capsys, params: dict | None = None, name: str = "exp-params.yaml"):
    """The stage's own entry point, in process: (exit code, stderr, params path, output path)."""
    path = tmp_path / name
    path.write_text(yaml.safe_dump(params if params is not None else PARAMS))
    out = tmp_path / "ok.json"
    code = check_params.main(["--params", str(path), "--output", str(out)])
    return code, capsys.readouterr().err, path, out


def test_the_project_params_pass(tmp_path, capsys):
    code, err, _, out = run_check(tmp_path, capsys)
    assert code == 0, err
    assert json.loads(out.read_text()) == {"params": "valid"}


def _with(change):
    params = copy.deepcopy(PARAMS)
    change(params)
    return params


BAD = {
    "transfer lr as text": (lambda p: p["transfer"].update(lr="fast"), "lr"),
    "a recipe's unknown key": (lambda p: p["transfer"]["joint"].update(learning_rate=1e-5), "learning_rate"),
    "unknown section": (lambda p: p.update(extra={"a": 1}), "extra"),
    "data key misspelt": (lambda p: p["data"].update(mirorr="x"), "mirorr"),
    "evaluate pooling": (lambda p: p["evaluate"].update(pooling="max"), "evaluate.pooling"),
    "registry margin": (lambda p: p["registry"].update(min_delta=-0.1), "registry.min_delta"),
    "flows timeout": (lambda p: p["flows"].update(retries="two"), "flows.retries"),
    "serve body limit": (lambda p: p["serve"].update(max_body_bytes=0), "serve.max_body_bytes"),
    "retrain method": (lambda p: p["retrain"].update(method="gpl"), "retrain.method"),
    "distill without a teacher": (
        lambda p: p["retrain"].update(method="distill") or p["teacher"].update(model="none"),
        "teacher.model is none",
    ),
    "model length": (lambda p: p["model"].update(max_length="long"), "model.max_length"),
    "transfer texts": (lambda p: p["transfer"].update(texts="/no/such/texts"), "transfer.texts"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_wrong_value_in_any_section_is_one_line_naming_the_file_used(tmp_path, capsys, case):
    change, key = BAD[case]
    code, err, path, out = run_check(tmp_path, capsys, _with(change))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{path}:"), lines[0]  # the file given with --params, not "params.yaml"
    assert key in lines[0]
    assert not out.exists()


def test_a_missing_params_file_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        check_params.main(["--params", str(tmp_path / "missing.yaml")])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip() == f"{tmp_path / 'missing.yaml'}: no such params file"


def test_every_stage_is_downstream_of_check_params_and_it_reads_every_section():
    assert sorted(DVC_STAGES["check_params"]["params"]) == sorted(PARAMS) == sorted(check_params.SECTIONS)
    producers = {}
    for name, stage in DVC_STAGES.items():
        for out in stage.get("do", stage).get("outs", []) + stage.get("do", stage).get("metrics", []):
            producers[next(iter(out)) if isinstance(out, dict) else out] = name

    def upstream(name: str, seen: set[str]) -> set[str]:
        stage = DVC_STAGES[name].get("do", DVC_STAGES[name])
        for dep in stage.get("deps", []):
            dep = dep.replace("models/${item}", "models/base")
            producer = next(
                (p for out, p in producers.items() if dep == out or dep.startswith(out + "/")), None
            )
            if producer and producer not in seen:
                seen.add(producer)
                upstream(producer, seen)
        return seen

    for name in DVC_STAGES:
        if name != "check_params":
            assert "check_params" in upstream(name, set()), f"{name} can run before params.yaml is checked"


def _dvc(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DVC_NO_ANALYTICS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "dvc", *args], cwd=repo, capture_output=True, text=True, check=check, env=env
    )


def scratch_repo(tmp_path: Path) -> Path:
    """A scratch git + DVC repository: the project's params.yaml and check_params stage (its command, params and
    output) before a stand-in for transfer that depends on its output and on the `transfer` params, with a
    cached model folder and an uncached, git-tracked metrics file, as the real stage has; reproduced, committed."""
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "config", "user.email", "t@example.com"], cwd=repo, check=True)
    subprocess.run(["git", "config", "user.name", "t"], cwd=repo, check=True)
    _dvc(repo, "init", "-q")
    _dvc(repo, "config", "core.analytics", "false")
    (repo / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    check = dict(DVC_STAGES["check_params"])
    check["cmd"] = (
        f"{sys.executable} -m stages.check_params --params params.yaml --output metrics/params_ok.json"
    )
    check.pop("deps")  # the project's modules are not in the scratch repository
    writer = (
        "import pathlib, yaml; p = yaml.safe_load(open('params.yaml'))['transfer']; "
        "pathlib.Path('models/transfer-base').mkdir(parents=True, exist_ok=True); "
        "pathlib.Path('models/transfer-base/weights.txt').write_text(str(p['lr'])); "
        "pathlib.Path('metrics/train').mkdir(parents=True, exist_ok=True); "
        "pathlib.Path('metrics/train/transfer-base.json').write_text(str(p['steps']))"
    )
    transfer = {
        "cmd": f'{sys.executable} -c "{writer}"',
        "deps": ["metrics/params_ok.json"],
        "params": ["transfer"],
        "outs": ["models/transfer-base", {"metrics/train/transfer-base.json": {"cache": False}}],
    }
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"check_params": check, "transfer": transfer}}))
    _dvc(repo, "repro")
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-qm", "baseline"], cwd=repo, check=True)
    return repo


def test_dvc_exp_run_with_a_bad_value_deletes_no_output(tmp_path):
    """The issue's case: `dvc exp run -S` with a value check_params refuses."""
    repo = scratch_repo(tmp_path)
    model = (repo / "models/transfer-base/weights.txt").read_bytes()
    record = (repo / "metrics/train/transfer-base.json").read_bytes()

    failed = _dvc(repo, "exp", "run", "-S", "transfer.lr=fast", check=False)

    assert failed.returncode != 0
    assert "lr: a number (float), got 'fast'" in failed.stdout + failed.stderr
    assert (repo / "models/transfer-base/weights.txt").read_bytes() == model
    assert (repo / "metrics/train/transfer-base.json").read_bytes() == record

    # and the documented way back to the baseline leaves DVC clean
    subprocess.run(["git", "checkout", "params.yaml", "dvc.lock", "metrics"], cwd=repo, check=True)
    _dvc(repo, "checkout")
    assert json.loads(_dvc(repo, "status", "--json").stdout or "{}") == {}
