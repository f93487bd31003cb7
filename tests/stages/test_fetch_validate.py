"""fetch and validate on the real SentEval mirror, and every kind of bad input the issue names."""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from pathlib import Path

import pandas as pd
import pytest

from sentcl.data import fetching, validation
from sentcl.data.senteval import EXPECTED_NLI, EXPECTED_PAIRS
from stages import fetch as fetch_stage
from stages import validate as validate_stage
from tests.paths import ROOT

MIRROR = Path(os.environ.get("SENTEVAL_MIRROR", ROOT.parent / "shared" / "senteval"))
pytestmark = pytest.mark.skipif(not MIRROR.is_dir(), reason="the SentEval mirror is not beside the checkout")

# SentEval's published pair counts, written out here independently of the code's own table.
SENTEVAL_COUNTS = {
    "STS12 test": 3108,
    "STS13 test": 1500,
    "STS14 test": 3750,
    "STS15 test": 3000,
    "STS16 test": 1186,
    "STSb train": 5749,
    "STSb dev": 1500,
    "STSb test": 1379,
    "SICK-R test": 4927,
}


def config(**overrides) -> fetching.FetchConfig:
    values = dict(
        mirror=None,
        upstream="http://127.0.0.1:9/senteval.tar",  # port 9 (discard) is closed: an offline upstream
        snli_upstream="http://127.0.0.1:9/snli_1.0.zip",
        multinli_upstream="http://127.0.0.1:9/multinli_1.0.zip",
        full_nli=False,
        connect_timeout_s=2,
    )
    return fetching.FetchConfig(**(values | overrides))


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    """data/raw as the fetch stage makes it from the mirror (shared, read-only by convention)."""
    out = tmp_path_factory.mktemp("fetched") / "raw"
    fetch_stage.fetch(config(mirror=str(MIRROR)), out)
    return out


@pytest.fixture
def raw_copy(raw, tmp_path) -> Path:
    copy = tmp_path / "raw"
    shutil.copytree(raw, copy)
    return copy


@pytest.fixture
def previous(tmp_path) -> Path:
    """A data/processed from an earlier good run, which a failed validation must leave alone."""
    processed = tmp_path / "processed"
    processed.mkdir()
    (processed / "pairs.parquet").write_bytes(b"earlier result")
    return processed


# ---------------------------------------------------------------- fetch


def test_fetch_copies_the_mirror_with_a_manifest_of_checksums(raw):
    manifest = json.loads((raw / "MANIFEST.json").read_text())
    origin = json.loads(fetching.source_record(raw).read_text())
    assert origin["source"] in ("../shared/senteval", f"local folder {MIRROR.name}")
    gold = "STS/STS12-en-test/STS.gs.MSRpar.txt"
    assert (raw / gold).read_bytes() == (MIRROR / gold).read_bytes()
    import hashlib

    assert manifest["files"][gold]["sha256"] == hashlib.sha256((MIRROR / gold).read_bytes()).hexdigest()
    assert {"SNLI/labels.dev", "SICK/SICK_test_annotated.txt", "STS/STSBenchmark/sts-dev.csv"} <= set(
        manifest["files"]
    )


def test_manifest_names_no_absolute_path_so_data_raw_hashes_alike_everywhere(tmp_path):
    """Issue 14: MANIFEST.json is inside data/raw; the mirror's location must not change its bytes."""
    manifests = []
    for where in ("a", "b/deeper"):
        mirror = tmp_path / where / "senteval"
        shutil.copytree(MIRROR, mirror)
        out = tmp_path / where / "raw"
        fetch_stage.fetch(config(mirror=str(mirror)), out)
        manifests.append((out / "MANIFEST.json").read_bytes())
    assert manifests[0] == manifests[1]
    origin = json.loads(fetching.source_record(tmp_path / "a" / "raw").read_text())
    assert origin["source"] == "local folder senteval"
    assert str(tmp_path) not in manifests[0].decode()


def test_switching_mirrors_leaves_data_raw_byte_identical(tmp_path, http_root, monkeypatch):
    """The same files from a folder mirror and from a tarball URL give the same data/raw, MANIFEST.json
    included, so `dvc repro -f fetch` after switching SENTEVAL_MIRROR leaves every later stage up to date;
    where the files came from is recorded beside data/raw, not in it."""
    monkeypatch.delenv("SENTEVAL_MIRROR", raising=False)  # the environment would win over data.mirror
    www, base = http_root
    with tarfile.open(www / "senteval.tar", "w") as tar:
        tar.add(MIRROR, arcname="senteval")
    folder_out, url_out = tmp_path / "one" / "raw", tmp_path / "two" / "raw"
    fetch_stage.fetch(config(mirror=str(MIRROR)), folder_out)
    fetch_stage.fetch(config(mirror=f"{base}/senteval.tar"), url_out)

    def tree(root):
        return {
            p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
        }

    assert tree(folder_out) == tree(url_out)
    assert "source" not in json.loads((folder_out / "MANIFEST.json").read_text())
    sources = [json.loads(fetching.source_record(out).read_text())["source"] for out in (folder_out, url_out)]
    # the team mirror beside the checkout is named as such, any other folder by its name only
    team = (ROOT.parent / "shared" / "senteval").resolve()
    folder_name = "../shared/senteval" if MIRROR.resolve() == team else f"local folder {MIRROR.name}"
    assert sources == [folder_name, f"{base}/senteval.tar"]


def test_environment_variable_wins_over_params(monkeypatch, tmp_path):
    monkeypatch.setenv("SENTEVAL_MIRROR", str(MIRROR))
    setting, source = fetching.choose_source(config(mirror=str(tmp_path)), tmp_path / "no-team-mirror")
    assert (setting, source) == ("SENTEVAL_MIRROR", str(MIRROR))
    monkeypatch.delenv("SENTEVAL_MIRROR")
    assert fetching.choose_source(config(mirror=str(tmp_path)), tmp_path / "no-team-mirror") == (
        "data.mirror",
        str(tmp_path),
    )


@pytest.fixture
def http_root(tmp_path):
    """A real HTTP server on loopback serving ``tmp_path/www``."""
    www = tmp_path / "www"
    www.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(www))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield www, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_fetch_from_a_tarball_url_gives_the_same_files(raw, http_root, tmp_path):
    www, base = http_root
    with tarfile.open(www / "senteval.tar", "w") as tar:  # wrapped the way SentEval's own tree is
        tar.add(MIRROR, arcname="SentEval/data/downstream")
    out = tmp_path / "from-url"
    manifest = fetch_stage.fetch(config(mirror=f"{base}/senteval.tar"), out)
    reference = json.loads((raw / "MANIFEST.json").read_text())["files"]
    assert {k: v["sha256"] for k, v in manifest["files"].items()} == {
        k: v["sha256"] for k, v in reference.items()
    }


def test_upstream_stsonly_tarball_plus_snli_release_are_converted(http_root, tmp_path, monkeypatch):
    """The SimCSE tarball has STS and SICK only; SNLI comes from its zip, tokenised as SentEval does."""
    www, base = http_root
    with tarfile.open(www / "senteval.tar", "w") as tar:
        tar.add(MIRROR / "STS", arcname="STS")
        tar.add(MIRROR / "SICK", arcname="SICK")
    records = [
        {"gold_label": "entailment", "sentence1": 'A man says "hi."', "sentence2": "A man isn't silent."},
        {"gold_label": "-", "sentence1": "dropped", "sentence2": "dropped"},
        {"gold_label": "neutral", "sentence1": "Kids play.", "sentence2": "Kids play (outside)."},
    ]
    with zipfile.ZipFile(www / "snli_1.0.zip", "w") as zf:
        for split in ("dev", "test"):
            zf.writestr(f"snli_1.0/snli_1.0_{split}.jsonl", "\n".join(json.dumps(r) for r in records))
    monkeypatch.setattr(fetch_stage, "SHARED_MIRROR", tmp_path / "no-team-mirror")
    monkeypatch.delenv("SENTEVAL_MIRROR", raising=False)
    out = tmp_path / "raw"
    fetch_stage.fetch(config(upstream=f"{base}/senteval.tar", snli_upstream=f"{base}/snli_1.0.zip"), out)
    assert (out / "SNLI/s1.dev").read_text().splitlines() == ["A man says `` hi . '' ", "Kids play . "]
    assert (out / "SNLI/s2.test").read_text().splitlines() == [
        "A man is n't silent . ",
        "Kids play ( outside ) . ",
    ]
    assert (out / "SNLI/labels.dev").read_text().splitlines() == ["entailment", "neutral"]


def test_offline_without_a_mirror_fails_at_once_with_one_sentence(tmp_path):
    env = os.environ | {"SENTEVAL_MIRROR": "http://127.0.0.1:9/senteval.tar"}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "stages.fetch"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert time.monotonic() - started < 30
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "SENTEVAL_MIRROR" in lines[0] and "127.0.0.1:9" in lines[0]


def test_full_nli_without_network_fails_instead_of_falling_back(tmp_path, monkeypatch):
    monkeypatch.delenv("SENTEVAL_MIRROR", raising=False)  # the environment would win over data.mirror
    with pytest.raises(fetching.FetchError, match="snli_1.0.zip"):
        fetch_stage.fetch(config(mirror=str(MIRROR), full_nli=True), tmp_path / "raw")
    assert not (tmp_path / "raw").exists()


def test_empty_mirror_folder_is_refused_and_keeps_the_previous_data(tmp_path, monkeypatch):
    monkeypatch.delenv("SENTEVAL_MIRROR", raising=False)  # the environment would win over data.mirror
    out = tmp_path / "raw"
    out.mkdir()
    (out / "keep.txt").write_text("earlier")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(fetching.FetchError, match="lacks 60 required files"):
        fetch_stage.fetch(config(mirror=str(empty)), out)
    assert (out / "keep.txt").read_text() == "earlier"


# ---------------------------------------------------------------- validate


def test_validate_real_mirror_gives_senteval_counts(raw, tmp_path):
    report = validate_stage.validate(raw, tmp_path / "processed", tmp_path / "validation.json")
    assert report["success"], report["violations"][:5]
    # The report is tracked in git: no wall time, and no absolute path for data inside the repository.
    assert "seconds" not in report
    assert validate_stage.repo_relative(validate_stage.RAW) == "data/raw"
    assert validation.summary(report) == {"pairs": sum(report["pairs"].values()) + 19666, "violations": 0}
    assert {k: report["pairs"].get(k, report["nli_pairs"].get(k)) for k in SENTEVAL_COUNTS} == SENTEVAL_COUNTS
    assert report["nli_pairs"] == {"SNLI dev": 9842, "SNLI test": 9824}
    pairs = pd.read_parquet(tmp_path / "processed/pairs.parquet")
    nli = pd.read_parquet(tmp_path / "processed/nli.parquet")
    assert list(pairs.columns[:6]) == ["task", "subset", "split", "sentence1", "sentence2", "score"]
    # data/processed is a DVC output: its `source` column is relative to the raw folder, so two clones agree.
    assert "STS/STS12-en-test/STS.input.MSRpar.txt" in set(pairs["source"])
    assert set(nli["source"]) == {"SNLI/s1.dev", "SNLI/s1.test"}
    assert not any(Path(s).is_absolute() for s in (*pairs["source"], *nli["source"]))
    assert set(nli["label"]) == {"entailment", "neutral", "contradiction"}
    assert len(pairs[(pairs.task == "STS16")]) == 1186
    # unscored pairs are skipped and counted: STS15/16 ship many
    assert report["unscored_pairs_skipped"]["STS16"] > 0 and report["unscored_pairs_skipped"]["STS12"] == 0
    assert EXPECTED_PAIRS[("STS12", "test")] == 3108 and EXPECTED_NLI[("SNLI", "dev")] == 9842


def _mutate(path: Path, line: int, new: bytes | None) -> None:
    lines = path.read_bytes().split(b"\n")
    if new is None:
        del lines[line - 1]
    else:
        lines[line - 1] = new
    path.write_bytes(b"\n".join(lines))


def _truncate(path: Path, keep: int) -> None:
    path.write_bytes(b"\n".join(path.read_bytes().split(b"\n")[:keep]) + b"\n")


BAD_INPUTS = {
    # name: (mutation, expected file suffix, expected line, expected rule fragment)
    "truncated file": (
        lambda r: _truncate(r / "STS/STS12-en-test/STS.input.MSRpar.txt", 700),
        "STS.input.MSRpar.txt",
        701,
        "same number of lines",
    ),
    "score 7.5": (
        lambda r: _mutate(r / "STS/STS12-en-test/STS.gs.MSRvid.txt", 3, b"7.5"),
        "STS.gs.MSRvid.txt",
        3,
        "STS score within 0-5",
    ),
    "non-UTF-8 bytes": (
        lambda r: _mutate(r / "STS/STSBenchmark/sts-dev.csv", 12, b"main\tx\ty\t1\t2.0\tcaf\xe9\tcafe"),
        "sts-dev.csv",
        12,
        "text is UTF-8",
    ),
    "line with no tab": (
        lambda r: _mutate(r / "STS/STS13-en-test/STS.input.headlines.txt", 5, b"no tab on this line"),
        "STS.input.headlines.txt",
        5,
        "two tab-separated sentences",
    ),
    "unknown NLI label": (
        lambda r: _mutate(r / "SNLI/labels.test", 42, b"maybe"),
        "labels.test",
        42,
        "NLI label in",
    ),
    "missing file": (
        lambda r: (r / "SICK/SICK_test_annotated.txt").unlink(),
        "SICK_test_annotated.txt",
        None,
        "file exists",
    ),
    "empty folder": (
        lambda r: [shutil.rmtree(p) if p.is_dir() else p.unlink() for p in list(r.iterdir())],
        "raw",
        None,
        "data folder is not empty",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_names_file_line_and_rule_and_loses_nothing(case, raw_copy, previous, tmp_path):
    mutate, file_suffix, line, rule = BAD_INPUTS[case]
    mutate(raw_copy)
    report = validate_stage.validate(raw_copy, previous, tmp_path / "validation.json")
    assert not report["success"]
    matching = [
        v
        for v in report["violations"]
        if v["file"].endswith(file_suffix) and v["line"] == line and rule in v["rule"]
    ]
    assert matching, report["violations"][:10]
    assert (previous / "pairs.parquet").read_bytes() == b"earlier result"
    assert json.loads((tmp_path / "validation.json").read_text())["violations"] == report["violations"]


def test_validate_command_prints_violations_and_exits_nonzero(tmp_path):
    """The stage as DVC runs it: file:line: rule on stderr, non-zero exit, the processed folder untouched."""
    project = tmp_path / "project"
    shutil.copytree(ROOT / "stages", project / "stages")
    shutil.copytree(ROOT / "sentcl", project / "sentcl")
    shutil.copytree(ROOT / "sentcl_gx", project / "sentcl_gx")
    (project / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    fetch_stage.fetch(config(mirror=str(MIRROR)), project / "data/raw")
    _mutate(project / "data/raw/STS/STS12-en-test/STS.gs.MSRvid.txt", 3, b"7.5")
    (project / "data/processed").mkdir(parents=True)
    (project / "data/processed/keep").write_text("x")
    result = subprocess.run(
        [sys.executable, "-m", "stages.validate"], cwd=project, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1
    assert (
        f"{project}/data/raw/STS/STS12-en-test/STS.gs.MSRvid.txt:3: STS score within 0-5 (score 7.5)"
        in result.stderr
    )
    assert "dvc checkout data/processed" in result.stderr
    assert (project / "data/processed/keep").read_text() == "x"
    assert "Traceback" not in result.stderr


def test_readers_raise_on_first_problem_outside_validation(raw_copy):
    from sentcl.data.senteval import DataFormatError, read_sts_subset

    _mutate(raw_copy / "STS/STS12-en-test/STS.gs.MSRpar.txt", 9, b"high")
    with pytest.raises(DataFormatError, match=r"STS.gs.MSRpar.txt:9: score is a number"):
        read_sts_subset(raw_copy / "STS/STS12-en-test", "STS12", "MSRpar")


def test_tar_members_outside_the_target_or_links_are_refused(tmp_path):
    import io

    archive = tmp_path / "bad.tar"
    with tarfile.open(archive, "w") as tf:
        data = b"x"
        member = tarfile.TarInfo("../escape.txt")
        member.size = len(data)
        tf.addfile(member, io.BytesIO(data))
    with tarfile.open(archive) as tf, pytest.raises(fetching.FetchError, match="escape.txt"):
        fetching.refuse_unsafe_members(tf, archive, tmp_path / "out")
    link = tmp_path / "link.tar"
    with tarfile.open(link, "w") as tf:
        member = tarfile.TarInfo("data/passwd")
        member.type, member.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tf.addfile(member)
    with tarfile.open(link) as tf, pytest.raises(fetching.FetchError, match="a link"):
        fetching.refuse_unsafe_members(tf, link, tmp_path / "out")
