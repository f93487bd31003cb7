"""The documentation site builds strictly (every page in the nav, every link and anchor valid), and the
README stays what a newcomer reads first: short, narrow, and free of commit hashes (those live in the
results log only)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import ROOT

# A commit hash as the docs would cite one: 7 to 40 hex digits with at least one letter and one digit.
HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")


def _mkdocs() -> list[str]:
    exe = Path(sys.executable).with_name("mkdocs")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("mkdocs")
    if not found:
        pytest.fail("mkdocs is not installed: pip install -c requirements.lock -e '.[dev]'")
    return [found]


def test_docs_site_builds_strictly(tmp_path):
    out = subprocess.run(
        # never --quiet: it hides the warnings --strict turns into a failure (a link to a missing anchor)
        [*_mkdocs(), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log
    assert not [line for line in log.splitlines() if line.startswith("WARNING")], log
    assert (tmp_path / "site" / "index.html").exists()
    # the README is not a page of the site: its links into the docs are checked against the built pages' ids
    broken = [
        f"{page}#{anchor}"
        for page, anchor in re.findall(r"\]\(docs/([\w-]+)\.md#([\w-]+)\)", (ROOT / "README.md").read_text())
        if f'id="{anchor}"' not in (tmp_path / "site" / page / "index.html").read_text()
    ]
    assert not broken, f"README.md links to anchors the docs do not have: {broken}"
    # drafts from other branches are never published
    assert not (tmp_path / "site" / "_incoming").exists()


def test_readme_is_short_and_narrow():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 260, f"README.md has {len(lines)} lines; depth belongs in docs/"
    wide = [i for i, line in enumerate(lines, 1) if len(line) > 120]
    assert not wide, f"README.md lines over 120 characters: {wide}"


def test_commit_hashes_only_in_the_results_log():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    offenders = []
    for page in pages:
        if page.name == "results.md":
            continue
        for i, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            # sha256 digests in examples are not commits: skip lines that say so
            if "sha256" in line:
                continue
            for match in HASH.findall(line):
                offenders.append(f"{page.relative_to(ROOT)}:{i}: {match}")
    assert not offenders, "commit hashes belong in docs/results.md only:\n" + "\n".join(offenders)


def test_readme_links_into_the_docs_resolve():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\((docs/[^)#]+)", text)
    assert targets, "the README links into docs/"
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, missing
