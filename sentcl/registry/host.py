"""What a registry process knows of its own host, with no MLflow: whether a process that holds a lease here has
certainly ended (``holder_identity``, ``holder_gone``), and the gate process's privacy (``close_process``: not
dumpable, not traceable by its own OS user; ``private_folder`` and ``clear_scratch``: a 0700 scratch of its own,
emptied at start and after each judgment)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

PR_SET_DUMPABLE = 4
TAG_HOLDER = "holder"  # on every lease version: which process holds (or waits for) it


def _process_start(pid: int) -> str | None:
    """The start time of ``pid`` (clock ticks since boot, /proc/<pid>/stat field 22); None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 and fields[0] != "Z" else None  # a zombie has stopped holding


def _here() -> dict[str, str]:
    """This host and PID namespace: a holder found here can be checked for being alive."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        return {}
    return {"boot": boot, "pidns": pidns}


def holder_identity() -> str:
    """The ``holder`` tag of a lease version this process creates."""
    here = _here()
    start = _process_start(os.getpid())
    if not here or start is None:
        return "{}"
    return json.dumps({**here, "pid": os.getpid(), "start": start}, sort_keys=True)


def holder_gone(version: Any) -> str | None:  # a ModelVersion of the lease model
    """Why the process that created this lease version has certainly ended (a sentence), or None when that
    cannot be told from here: it ran on another host, in another PID namespace (a container, the worker's
    sandbox), or left no ``holder`` tag. Checked on this host: the same boot, the same PID namespace, and its
    PID no longer running the process that started at that moment (a reused PID is not it)."""
    try:
        holder = json.loads((version.tags or {}).get(TAG_HOLDER) or "{}")
        pid, start = int(holder["pid"]), str(holder["start"])
    except (ValueError, KeyError, TypeError):
        return None
    here = _here()
    if not here or holder.get("boot") != here["boot"] or holder.get("pidns") != here["pidns"]:
        return None
    now = _process_start(pid)
    if now == start:
        return None
    return f"process {pid} on this host has exited" + (" (its PID now runs another process)" if now else "")


def close_process() -> None:
    """No core dumps, and /proc/<pid>/environ, /proc/<pid>/mem and ptrace closed to every process without
    CAP_SYS_PTRACE (every process of the same OS user unless it is root)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def private_folder(folder: Path) -> Path:
    """``folder`` made (or found) as a real folder of this user's with mode 0700: the gate's scratch, where its
    downloads and copies of the dev pairs live, out of the sandboxed worker's sight."""
    import stat

    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise OSError(f"{folder} is not a folder of this user's (a link, or another owner's); not using it")
    os.chmod(folder, 0o700)
    return folder


def clear_scratch(folder: Path, keep: Path | None = None) -> int:
    """Remove everything in the gate's own scratch ``folder`` but ``keep``: what a killed gate left (downloads,
    copies), at start and after each judgment. Links are removed, never followed. Returns the entries removed."""
    import shutil

    removed = 0
    for entry in list(folder.iterdir()):
        if keep is not None and entry.resolve() == keep.resolve():
            continue
        if entry.is_symlink() or not entry.is_dir():
            entry.unlink(missing_ok=True)
        else:
            shutil.rmtree(entry, ignore_errors=True)
        removed += 1
    return removed
