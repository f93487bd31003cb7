"""sha256 of files read in 1 MiB blocks: the one digest loop of the project. (``sentcl_mlflow/pyfunc_checks.py``
keeps its own copy on purpose: it travels inside every logged model and imports nothing of this repository.)"""

from __future__ import annotations

import hashlib
from pathlib import Path

BLOCK = 1 << 20


def update_from_file(h: hashlib._Hash, path: Path) -> None:
    """Feed the bytes of ``path`` to ``h`` block by block (a model's weights need not fit in memory twice)."""
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(BLOCK), b""):
            h.update(block)


def file_sha256(path: Path) -> str:
    """The hex sha256 of the bytes of ``path``."""
    h = hashlib.sha256()
    update_from_file(h, path)
    return h.hexdigest()
