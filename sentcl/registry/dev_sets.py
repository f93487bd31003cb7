"""What the gate reads of what others wrote, within bounds: the pairs it scores every model on (``DevSets``: the
validate stage's pairs table and a domain's scored pairs), each file's size checked before it is read
(params.yaml ``gate:``, ``GateLimits``), and a file under a folder that another account writes, opened without
following a link (``read_regular``). No MLflow here: ``sentcl_mlflow.registry`` gathers, this reads."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from sentcl.params import ROOT, InputError
from sentcl.registry.rules import GateLimits

# The validate stage's table of scored pairs (stages.common.PROCESSED, which this package cannot import).
DEV_PAIRS = ROOT / "data" / "processed" / "pairs.parquet"
MB = 1024 * 1024

Pair = tuple[str, str, float]


class GateDevSetError(InputError, LookupError):
    """The pairs the gate scores models on are missing, empty, unreadable or past ``gate:``'s limits."""


def within(path: Path, limit_mb: float, key: str) -> None:
    """``path`` is at most ``limit_mb`` MiB (its size, never its contents, read); else one line."""
    size = path.stat().st_size
    if size > limit_mb * MB:
        raise GateDevSetError(
            f"{path}: {size / MB:.1f} MiB, more than {key} ({limit_mb:g} MiB); refused unread"
        )


def read_domain_pairs(path: Path | str, limits: GateLimits | None, flag: str = "--domain-dev") -> list[Pair]:
    """A domain's scored pairs (``sentence1<TAB>sentence2<TAB>score``, as ``--domain-dev`` reads them), the file
    within ``gate.max_domain_mb`` before it is read and its pairs within ``gate.max_domain_pairs``; else one
    line, :class:`GateDevSetError`."""
    from sentcl.data.domain import DomainTextError, read_flag_pairs

    path = Path(path)
    if limits is not None and path.is_file():
        within(path, limits.max_domain_mb, "gate.max_domain_mb")
    try:
        pairs = read_flag_pairs(path, flag=flag)
    except DomainTextError as e:
        raise GateDevSetError(str(e)) from None
    if limits is not None and len(pairs) > limits.max_domain_pairs:
        raise GateDevSetError(
            f"{path}: {len(pairs)} domain dev pairs, more than gate.max_domain_pairs "
            f"({limits.max_domain_pairs}); refused unread"
        )
    return pairs


def recorded_pairs_problem(path: Path, sha256: str, limits: GateLimits) -> str | None:
    """Why a candidate's domain dev pairs at ``path`` may not be judged on, or None: past ``gate.max_domain_mb``
    (unread), other bytes than the ``sha256`` recorded at registration, more lines than ``gate.max_domain_pairs``."""
    size = path.stat().st_size
    if size > limits.max_domain_mb * MB:
        return (
            f"its domain dev pairs hold {size / MB:.1f} MiB, more than gate.max_domain_mb "
            f"({limits.max_domain_mb:g} MiB)"
        )
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        return f"its domain dev pairs {path} differ from those recorded at registration"
    rows = sum(1 for line in data.splitlines() if line.strip())
    if rows > limits.max_domain_pairs:
        return f"its domain dev pairs hold {rows} lines, more than gate.max_domain_pairs ({limits.max_domain_pairs})"
    return None


@dataclass(frozen=True)
class DevSets:
    """The pairs the gate scores every model on: STS-B dev, SICK-R trial, and the domain's when given."""

    stsb_dev: tuple[Pair, ...]
    sick_dev: tuple[Pair, ...]
    domain: tuple[Pair, ...] | None = None
    source: str = ""

    @classmethod
    def load(
        cls,
        pairs_file: Path | str | None = None,
        domain_dev: Path | str | None = None,
        limits: GateLimits | None = None,
    ) -> DevSets:
        """From the validate stage's ``pairs.parquet`` (the selection sets of ``sentcl.data.roles``) and a domain dev file
        (``sentence1<TAB>sentence2<TAB>score``, as ``--domain-dev`` reads it). Missing, empty, unreadable or past
        ``limits`` (params.yaml ``gate:``): one line, :class:`GateDevSetError`."""
        import pandas as pd

        path = Path(pairs_file or DEV_PAIRS)
        if not path.is_file():
            raise GateDevSetError(
                f"{path}: no dev pairs for the gate to score models on; run `dvc repro validate` first"
            )
        from sentcl.data.roles import selection_sets

        if limits is not None:
            within(path, limits.max_pairs_table_mb, "gate.max_pairs_table_mb")
        try:
            table = pd.read_parquet(path, columns=["task", "split", "sentence1", "sentence2", "score"])
        except Exception as e:  # pyarrow's ArrowInvalid, a missing column: not a pairs table
            raise GateDevSetError(
                f"{path}: not a pairs table the gate can read ({type(e).__name__})"
            ) from None
        # The selection role (sentcl.data.roles): STS-B dev as published, SICK-R trial less its test pairs.
        sets = {name: tuple(rows) for name, rows in selection_sets(table).items()}
        stsb = sets["stsb_dev"]
        if len(stsb) < 3:
            raise GateDevSetError(f"{path}: {len(stsb)} STS-B dev pair(s); the gate needs the dev split")
        domain = tuple(read_domain_pairs(domain_dev, limits)) if domain_dev is not None else None
        return cls(stsb, sets["sick_trial"], domain, str(path))

    def describe(self) -> str:
        parts = [f"{len(self.stsb_dev)} STS-B dev", f"{len(self.sick_dev)} SICK-R trial"]
        if self.domain is not None:
            parts.append(f"{len(self.domain)} domain dev")
        return " + ".join(parts) + " pairs"


def read_regular(base: Path, rel: str, max_bytes: int | None = None) -> bytes | None:
    """The bytes of ``base``/``rel``, opened without following a link: every folder below ``base`` and the file
    itself with ``O_NOFOLLOW``, the file checked to be a regular one on the descriptor that is read (``fstat``), so
    a link or a folder swapped for one between a check and the read cannot point the gate at another file. None
    when it is absent. A link, a device, a FIFO or a folder in its place, or a file over ``max_bytes`` (its size
    read on the descriptor, nothing of it read): :class:`GateDevSetError`, one line.

    ``base`` is trusted (the checkout, or a folder the operator pins with ``--processed``); what lies below it may
    be the worker's (the pipeline's outputs, written from its sandbox)."""
    import errno
    import stat

    refused = GateDevSetError(
        f"{base / rel} is not a regular file under {base} (a symbolic link, or a folder on the way is one): the "
        "gate reads only regular files there; refused"
    )

    def below(fd: int, name: str, flags: int) -> int | None:  # one step down, never through a link
        try:
            return os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | flags, dir_fd=fd)
        except FileNotFoundError:
            return None
        except OSError as e:  # a link (ELOOP), a file where a folder should be, a FIFO with no writer
            if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO):
                raise refused from None
            raise

    *folders, name = Path(rel).parts
    opened = [os.open(base, os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECTORY)] if base.is_dir() else []
    try:
        for step, flags in [*((f, os.O_DIRECTORY) for f in folders), (name, os.O_NONBLOCK)]:
            fd = below(opened[-1], step, flags) if opened else None
            if fd is None:
                return None
            opened.append(fd)
        info = os.fstat(opened[-1])
        if not stat.S_ISREG(info.st_mode):
            raise refused
        if max_bytes is not None and info.st_size > max_bytes:
            raise GateDevSetError(
                f"{base / rel}: {info.st_size / 2**20:.1f} MiB, more than gate.max_pairs_table_mb "
                f"({max_bytes / 2**20:g} MiB); refused unread"
            )
        with os.fdopen(opened[-1], "rb", closefd=False) as f:
            return f.read()
    finally:
        for fd in opened:
            os.close(fd)
