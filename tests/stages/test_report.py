"""The report's first section says what shipped: the exported checkpoint, its registry version and whether it is
champion, the gate's reasons, whether validation passed, and the settings it trained with."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from stages import report
from tests.paths import ROOT

ROW = {"all": {"avg": 79.7, "STSb": 83.0}, "mean": {"avg": 78.0}, "stsb_dev": 87.41, "pooling": "last-avg"}
BASE = {"all": {"avg": 78.87, "STSb": 82.0}, "mean": {"avg": 77.0}, "stsb_dev": 86.72, "pooling": "last-avg"}


class Text(HTMLParser):
    """The visible text, in order, and the section headings."""

    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.headings: list[str] = []
        self._in: list[str] = []

    def handle_starttag(self, tag, attrs):  # noqa: ANN001
        self._in.append(tag)

    def handle_endtag(self, tag):  # noqa: ANN001
        if self._in:
            self._in.pop()

    def handle_data(self, data):  # noqa: ANN001
        if "style" in self._in:
            return
        if self._in and self._in[-1] == "h2":
            self.headings.append(data.strip())
        self.text.append(data)


def visible(page: str) -> Text:
    parser = Text()
    parser.feed(page)
    return parser


@pytest.fixture
def metrics(tmp_path) -> Path:
    m = tmp_path / "metrics"
    (m / "train").mkdir(parents=True)
    (m / "sts.json").write_text(json.dumps({"base": BASE, "transfer-base": ROW}))
    (m / "export.json").write_text(
        json.dumps(
            {
                "checkpoint": "transfer-base",
                "stsb_dev": 87.414,
                "trained_beat_init": True,
                "onnx_max_abs_diff": 1e-6,
            }
        )
    )
    (m / "validate.json").write_text(json.dumps({"pairs": 50765, "violations": 0}))
    (m / "train" / "transfer-base.json").write_text(
        json.dumps(
            {
                "stsb_dev_step0": 86.72,
                "stsb_dev_best": 87.41,
                "best_step": 30,
                "steps": 30,
                "examples": 24344,
                "precision": "fp32",
            }
        )
    )
    return m


def params(lr: float = 2e-5) -> dict:
    p = yaml.safe_load((ROOT / "params.yaml").read_text())
    p["transfer"]["lr"] = lr
    p["transfer"]["base"].pop("lr", None)
    p["transfer"]["base"]["objective"] = (
        "contrastive"  # the stage-section lr (a distilled recipe has its own)
    )
    return p


def test_the_first_section_names_the_champion_and_why(metrics, tmp_path):
    (metrics / "registry.json").write_text(
        json.dumps(
            {
                "registered_model": "sentcl-encoder",
                "registered_version": "3",
                "new_version": True,
                "gate": {
                    "decision": "promoted",
                    "reasons": ["STS-B dev +0.31 over version 2"],
                    "champion_after": "3",
                },
            }
        )
    )
    page = visible(report.render(metrics, tmp_path / "plots", params(lr=3e-5)))
    assert page.headings[0] == "What shipped"  # before the STS tables and curves
    first = " ".join(" ".join(page.text).split())
    first = first[: first.index("STS benchmark by checkpoint")]
    assert "transfer-base shipped: champion is version 3 of sentcl-encoder." in first
    assert "STS-B dev +0.31 over version 2" in first
    assert "passed: 50,765 pairs, no violation" in first
    assert re.search(r"30 steps, selected step 30 .*lr 3e-05; precision fp32", first), first


def test_a_rejected_challenger_and_a_missing_registry_say_so(metrics, tmp_path):
    page = " ".join(visible(report.render(metrics, tmp_path / "plots", params())).text)
    assert "not registered yet" in page and "nothing is registered" in page
    (metrics / "registry.json").write_text(
        json.dumps(
            {
                "registered_model": "sentcl-encoder",
                "registered_version": "4",
                "new_version": True,
                "gate": {
                    "decision": "rejected",
                    "reasons": ["STS-B dev +0.02 < min_delta 0.10"],
                    "champion_after": "3",
                },
            }
        )
    )
    page = " ".join(" ".join(visible(report.render(metrics, tmp_path / "plots", params())).text).split())
    assert "registered as version 4; the gate kept version 3." in page and "min_delta 0.10" in page


def test_text_from_the_records_is_escaped(metrics, tmp_path):
    (metrics / "registry.json").write_text(
        json.dumps(
            {
                "registered_model": "m",
                "registered_version": "1",
                "gate": {"decision": "promoted", "reasons": ["<script>x</script>"], "champion_after": "1"},
            }
        )
    )
    assert "<script>x</script>" not in report.render(metrics, tmp_path / "plots", params())


def test_a_distilled_champion_names_its_teacher(metrics, tmp_path):
    p = params()
    p["teacher"]["model"] = "all-mpnet-base-v2"
    p["transfer"]["base"]["objective"] = "distill"
    p["transfer"]["distillation"] = {"distill": {"examples": "neighbours", "neighbours": 5}, "lr": 1e-4}
    page = " ".join(" ".join(visible(report.render(metrics, tmp_path / "plots", p)).text).split())
    loss = p["train"]["distill"]["loss"]
    words = f"distill from all-mpnet-base-v2 ({loss}, examples a sentence and its 5 nearest neighbours); lr 0.0001"
    assert words in page
    p["transfer"]["distillation"]["distill"]["group_weight"] = 10.0
    page = " ".join(" ".join(visible(report.render(metrics, tmp_path / "plots", p)).text).split())
    assert "5 nearest neighbours, their own similarities weighing 10); lr 0.0001" in page
    p["transfer"]["distillation"] = {"distill": {"examples": "sentences"}, "lr": 1e-4}
    page = " ".join(" ".join(visible(report.render(metrics, tmp_path / "plots", p)).text).split())
    assert f"distill from all-mpnet-base-v2 ({loss}, examples sentences); lr 0.0001" in page
    p["transfer"]["base"]["objective"] = "contrastive"
    page = " ".join(" ".join(visible(report.render(metrics, tmp_path / "plots", p)).text).split())
    assert "contrastive; lr" in page and "distill from" not in page


def _split(seen: float | None, unseen: float, pairs: tuple[int, int, int]) -> dict:
    avg = {
        "seen": {"spearman": seen, "tasks": 7, "pairs": pairs[0]},
        "unseen": {"spearman": unseen, "tasks": 7, "pairs": pairs[1]},
        "mixed": {"spearman": None, "tasks": 0, "pairs": pairs[2]},
    }
    return {"tasks": {}, "avg": avg}


def test_the_seen_unseen_table_shows_each_split_with_its_pairs(metrics, tmp_path):
    page = " ".join(" ".join(visible(report.render(metrics, tmp_path / "plots", params())).text).split())
    assert "Seen and unseen sentences" not in page  # an sts.json from before the split: no table
    rows = {
        "base": BASE | {"seen_split": _split(None, 74.5, (0, 9000, 0))},
        "transfer-base": ROW | {"seen_split": _split(80.25, 75.0, (8000, 900, 100))},
    }
    for name, unseen in (("base", 74.11), ("transfer-base", 74.31)):
        rows[name]["unseen_sts"] = {"pairs": 750, "spearman": unseen, "from": "STS-B and SICK train pairs"}
    (metrics / "sts.json").write_text(json.dumps(rows))
    page = " ".join(" ".join(visible(report.render(metrics, tmp_path / "plots", params())).text).split())
    assert "Seen and unseen sentences" in page and "Unseen STS : STS-B and SICK train pairs" in page
    assert "base - (0) 74.50 (9000) - (0) 74.11 (750)" in page
    assert "transfer-base 80.25 (8000) 75.00 (900) - (100) 74.31 (750)" in page


def test_a_stage_not_trained_on_this_profile_says_so(metrics, tmp_path):
    (metrics / "train" / "nli.json").write_text(
        json.dumps({"steps": 0, "beat_init": False, "not_trained": "steps 0 on this profile (params.yaml)"})
    )
    (metrics / "train" / "transfer-joint.json").write_text(json.dumps({"steps": 30, "beat_init": False}))
    page = " ".join(" ".join(visible(report.render(metrics, tmp_path / "plots", params())).text).split())
    assert "nli: not trained, steps 0 on this profile (params.yaml)" in page
    assert "transfer-base: 30 steps, beat its init" not in page  # its record does not say it beat its init
    assert "transfer-joint: 30 steps, never beat its init: output = init" in page
