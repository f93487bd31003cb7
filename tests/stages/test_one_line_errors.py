"""What a newcomer mistypes is said in one line, at once, with exit code 2: a model path that does not exist, a
params file that does not exist, a registry version that does not exist, a dev file with a word for a score.
Messages name the params file actually read."""

from __future__ import annotations

import pytest
import yaml

from sentcl.data.domain import DomainTextError, read_scored_pairs
from tests.paths import ROOT


def one_line(capsys) -> str:
    # MLflow's own notice when it creates a scratch store (a new store only) is not the command's output
    lines = [
        line for line in capsys.readouterr().err.strip().splitlines() if " INFO mlflow.store.db" not in line
    ]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.delenv("PREFECT_API_URL", raising=False)


@pytest.mark.parametrize("init", ["models/nosuch", "/no/such/model/folder"])
def test_transfer_from_a_model_that_does_not_exist(init, capsys):
    from stages import transfer

    with pytest.raises(SystemExit) as exit_:
        transfer.main(["--init", init])
    assert exit_.value.code == 2
    assert one_line(capsys).startswith(f"transfer: --init {init}: no such model folder")


def test_pretrain_nli_from_a_model_that_does_not_exist(capsys):
    from stages import pretrain_nli

    with pytest.raises(SystemExit) as exit_:
        pretrain_nli.main(["--init", "models/nosuch"])
    assert exit_.value.code == 2
    assert one_line(capsys).startswith("nli: --init models/nosuch: no such model folder")


def test_evaluate_a_model_that_does_not_exist(tmp_path, capsys):
    from stages import evaluate

    (tmp_path / "data" / "STS").mkdir(parents=True)
    assert evaluate.main(["--model", "models/nosuch", "--data", str(tmp_path / "data")]) == 2
    assert one_line(capsys).startswith("evaluate: --model models/nosuch: no such model folder")


def test_a_params_file_that_does_not_exist(tmp_path, capsys):
    from stages import transfer

    with pytest.raises(SystemExit) as exit_:
        transfer.main(["--params", str(tmp_path / "missing.yaml")])
    assert exit_.value.code == 2
    assert one_line(capsys) == f"{tmp_path / 'missing.yaml'}: no such params file"


def test_a_bad_value_names_the_params_file_given(tmp_path, capsys):
    from stages import transfer

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["transfer"]["distillation"]["lr"] = "fast"  # the default recipe's (base distils)
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(params))
    with pytest.raises(SystemExit) as exit_:
        transfer.main(["--params", str(path)])
    assert exit_.value.code == 2
    assert one_line(capsys) == f"{path}: lr: a number (float), got 'fast'"


def test_a_dev_file_whose_only_line_has_a_word_for_a_score_names_the_line(tmp_path):
    dev = tmp_path / "dev.tsv"
    dev.write_text("a man plays\ta man is playing\tfive\n")
    with pytest.raises(DomainTextError, match=r"dev\.tsv:1: score 'five' is not a number"):
        read_scored_pairs(dev)
    # a real header followed by scored lines is still a header
    dev.write_text("s1\ts2\tscore\na\tb\t1\nc\td\t2\ne\tf\t3\n")
    assert len(read_scored_pairs(dev)) == 3


def test_embed_with_a_registry_version_that_does_not_exist(tmp_path, capsys):
    from stages import embed

    text = tmp_path / "in.txt"
    text.write_text("a sentence\n")
    code = embed.main(
        ["--input", str(text), "--output", str(tmp_path / "out.npy"), "--model", "models:/sentcl-encoder/99"]
    )
    assert code == 2
    err = one_line(capsys)
    assert err.startswith("embed: models:/sentcl-encoder/99:") and "99" in err and "not found" in err
    assert not (tmp_path / "out.npy").exists()


def test_promote_a_version_that_does_not_exist(capsys):
    from flows import promote

    with pytest.raises(SystemExit) as exit_:
        promote.main(["--version", "12"])
    assert exit_.value.code == 2
    err = one_line(capsys)
    assert err.startswith("promote: ") and "version=12" in err and "not found" in err
