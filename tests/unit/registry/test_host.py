"""sentcl.registry.host's scratch folder for the gate: made private, never a link or another account's."""

from __future__ import annotations

import os
import pwd

import pytest

from sentcl.registry.host import clear_scratch, private_folder


def test_a_new_or_loose_scratch_folder_ends_0700(tmp_path):
    made = private_folder(tmp_path / "a" / "gate")
    assert made.is_dir() and made.stat().st_mode & 0o777 == 0o700
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    os.chmod(loose, 0o777)
    assert private_folder(loose).stat().st_mode & 0o777 == 0o700


def test_a_link_in_place_of_the_scratch_is_refused_and_its_target_left_alone(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    os.chmod(target, 0o755)
    (tmp_path / "gate").symlink_to(target)
    with pytest.raises(OSError, match="not a folder of this user's"):
        private_folder(tmp_path / "gate")
    assert target.stat().st_mode & 0o777 == 0o755  # not chmod-ed through the link


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another account needs root")
def test_another_accounts_folder_is_refused(tmp_path):
    other = pwd.getpwnam("nobody")
    folder = tmp_path / "gate"
    folder.mkdir()
    os.chown(folder, other.pw_uid, other.pw_gid)
    with pytest.raises(OSError, match="not a folder of this user's"):
        private_folder(folder)


def test_clearing_keeps_the_pinned_copy_and_removes_links_without_following_them(tmp_path):
    scratch = private_folder(tmp_path / "gate")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("x")
    pinned = scratch / "pairs.parquet"
    pinned.write_bytes(b"p")
    (scratch / "left-by-a-kill").mkdir()
    (scratch / "left-by-a-kill" / "model.safetensors").write_bytes(b"\0" * 10)
    (scratch / "link").symlink_to(outside)
    assert clear_scratch(scratch, keep=pinned) == 2
    assert sorted(p.name for p in scratch.iterdir()) == ["pairs.parquet"]
    assert (outside / "precious").read_text() == "x"
