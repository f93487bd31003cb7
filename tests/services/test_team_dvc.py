"""DVC's ``shared`` remote on the team's S3 server (``infra/team/team-up``: SeaweedFS, bucket ``sentcl-dvc``):
one clone runs the stages ``fetch`` and ``base`` and ``dvc push -r shared`` with the ``dvc`` key, configured by
``infra/team/team.py dvc-remote`` (``.dvc/config.local``, 0600, ignored by git); the objects are in the bucket,
readable with that key and not with the registrar's; a fresh clone configured the same way pulls them
(``dvc pull -r shared``) and finds them up to date, with the same bytes. Before that, a push with the reader's
key is refused in one line and puts nothing in the bucket.

The clones, the stages and the checks of a pull are tests/services/test_dvc_remote.py's (a folder remote there)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time

import pytest

from tests.paths import ROOT
from tests.services.test_dvc_remote import MIRROR, STAGES, digests, dvc, run

TEAM = ROOT / "infra" / "team" / "team.py"
pytestmark = pytest.mark.skipif(not (MIRROR / "STS").is_dir(), reason="needs the SentEval mirror")


def team_module():  # noqa: ANN201 (infra/team/team.py, imported by path as test_team_servers.py does)
    sys.path.insert(0, str(TEAM.parent))
    import team as module

    return module


def s3(team, role: str):  # noqa: ANN001, ANN201 (a boto3 client with that role's key)
    module = team_module()
    state = module.State(team["state"])
    return module.s3_client(state.load(), state, role)


def objects(team) -> set[str]:
    """Every key in the bucket sentcl-dvc, listed with the dvc key."""
    pages = s3(team, "dvc").get_paginator("list_objects_v2").paginate(Bucket="sentcl-dvc")
    return {item["Key"] for page in pages for item in page.get("Contents", [])}


def point_at_team(team, clone) -> str:  # noqa: ANN001
    """The documented step: the checkout's `shared` remote on the team's S3 server, with the dvc key."""
    return run(
        ROOT, sys.executable, str(TEAM), "dvc-remote", "--state", str(team["state"]), "--repo", str(clone)
    )


def set_key(clone, key_id: str, secret: str) -> None:  # noqa: ANN001
    """What `dvc remote modify --local shared access_key_id ...` (and secret_access_key) writes, in-process."""
    from dvc.config import Config

    with Config(dvc_dir=str(clone / ".dvc")).edit("local") as conf:
        conf["remote"]["shared"].update(access_key_id=key_id, secret_access_key=secret)


def refused_push(clone) -> str:  # noqa: ANN001
    done = subprocess.run(
        [sys.executable, "-m", "dvc", "push", "-r", "shared"],
        cwd=clone,
        env=dict(os.environ, DVC_NO_ANALYTICS="1"),
        capture_output=True,
        text=True,
    )
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    errors = [line for line in out.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1 and "403" in errors[0] and "Traceback" not in out, out
    return errors[0]


def test_a_clone_pushes_to_the_team_s3_remote_and_a_fresh_clone_pulls_it_up_to_date(team, tmp_path):
    from botocore.exceptions import ClientError

    first, second = tmp_path / "first", tmp_path / "second"
    run(tmp_path, "git", "clone", "-q", str(ROOT), str(first))
    said = point_at_team(team, first)
    local = first / ".dvc" / "config.local"
    assert stat.S_IMODE(local.stat().st_mode) == 0o600, said
    key_id, secret = team_module().s3_key(team_module().State(team["state"]), "dvc")
    assert key_id in said and secret not in said and secret in local.read_text()
    # ignored by git (DVC's .dvc/.gitignore): the secret is in no tracked or untracked-but-addable file
    assert ".dvc/config.local" not in run(first, "git", "status", "--porcelain", "--untracked-files=all")
    # --single-item: check_params (upstream of both) writes no cached output (cache: false), nothing for a remote
    out = dvc(first, "repro", "--single-item", *STAGES)
    assert all(f"Running stage '{stage}'" in out for stage in STAGES), out

    # Refused: the reader's key, which has no right on sentcl-dvc (a wrong secret is refused at the S3 level in
    # test_team_servers.py). Nothing lands.
    before = objects(team)
    set_key(first, *team_module().s3_key(team_module().State(team["state"]), "reader"))
    print("the reader's key:", refused_push(first))
    assert objects(team) == before

    point_at_team(team, first)  # the dvc key again
    started = time.monotonic()
    out = dvc(first, "push", "-r", "shared")
    pushed_s = time.monotonic() - started
    cache = first / ".dvc" / "cache"  # files/md5/..., as the remote's cache/files/md5/... (runs/: not pushed)
    cached = {"cache/" + str(p.relative_to(cache)) for p in (cache / "files").rglob("*") if p.is_file()}
    assert cached and cached <= objects(team), out
    one = sorted(cached)[0]
    assert (
        s3(team, "dvc").get_object(Bucket="sentcl-dvc", Key=one)["Body"].read()
        == (cache / one.removeprefix("cache/")).read_bytes()
    )
    for call in (
        lambda: s3(team, "registrar").get_object(Bucket="sentcl-dvc", Key=one),
        lambda: s3(team, "registrar").list_objects_v2(Bucket="sentcl-dvc"),
    ):
        with pytest.raises(ClientError) as denied:
            call()
        assert denied.value.response["Error"]["Code"] in ("AccessDenied", "403"), denied.value.response
    author = ("-c", "user.name=t", "-c", "user.email=t@t")
    # --allow-empty: the committed dvc.lock may already hold these very outputs (a run of the same code and data)
    run(first, "git", *author, "commit", "--allow-empty", "-qam", "outputs of fetch and base")

    run(tmp_path, "git", "clone", "-q", str(first), str(second))
    assert not (second / ".dvc" / "config.local").exists()  # a clone gets no key: it is set up the same way
    point_at_team(team, second)
    started = time.monotonic()
    dvc(second, "pull", "-r", "shared", *STAGES)
    pulled_s = time.monotonic() - started
    pulled = digests(second)
    assert pulled and pulled == digests(first)
    # what `dvc repro` (make run) decides on: test_dvc_remote.py checks that a repro after such a pull runs nothing
    assert "Data and pipelines are up to date." in dvc(second, "status", *STAGES)
    print(
        f"dvc push -r shared: {len(cached)} objects in {pushed_s:.1f} s; dvc pull -r shared: {pulled_s:.1f} s"
    )
