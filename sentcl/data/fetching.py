"""SentEval STS12-16, STS-B, SICK and SNLI (and, with ``data.full_nli``, the NLI train splits) from a mirror or
the public upstream into one folder in SentEval layout, with a manifest of the files' sha256.

Sources, first that exists wins: $SENTEVAL_MIRROR, ``data.mirror`` (a folder or an http(s)/file URL of a tarball
in SentEval layout), the team mirror beside the checkout, then the public upstream (the SentEval tarball the
SimCSE authors publish for STS and SICK, and the SNLI release for SNLI dev/test).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, fields
from pathlib import Path

from tqdm import tqdm

from sentcl.data.senteval import SICK_FILES, SNLI_SPLITS, STSB_SPLITS, iter_sts_tasks
from sentcl.data.upstream import nli_jsonl_to_senteval, write_senteval_nli
from sentcl.params import flag, read_section, real_number, text

SET_SOURCE_HINT = (
    "set SENTEVAL_MIRROR (or data.mirror in params.yaml) to a folder or tarball URL in SentEval layout"
)


class FetchError(RuntimeError):
    """A source that cannot give the data; the message says what to do."""


@dataclass(frozen=True)
class FetchConfig:
    mirror: str | None
    upstream: str
    snli_upstream: str
    multinli_upstream: str
    full_nli: bool = False
    connect_timeout_s: float = 5.0

    @classmethod
    def from_params(cls, params: dict) -> FetchConfig:
        """params.yaml ``data:``, every key required, an unknown key or a wrong type a ``ValueError`` naming it."""
        data = read_section(params, "data", [f.name for f in fields(cls)])
        if data["mirror"] is not None:
            text(data["mirror"], "data.mirror", "a folder, a URL or null")
        for name in ("upstream", "snli_upstream", "multinli_upstream"):
            text(data[name], f"data.{name}", "a URL")
        flag(data["full_nli"], "data.full_nli")
        data["connect_timeout_s"] = real_number(data["connect_timeout_s"], "data.connect_timeout_s", above=0)
        return cls(**data)


def required_files() -> list[Path]:
    """Every file the validate stage reads, relative to a SentEval ``downstream`` folder."""
    files = []
    for _, subset, folder in iter_sts_tasks(Path()):
        files += [folder / f"STS.input.{subset}.txt", folder / f"STS.gs.{subset}.txt"]
    files += [Path("STS/STSBenchmark") / f"sts-{split}.csv" for split in STSB_SPLITS]
    files += [Path("SICK") / name for name in SICK_FILES.values()]
    files += [Path("SNLI") / f"{kind}.{split}" for split in SNLI_SPLITS for kind in ("s1", "s2", "labels")]
    return files


def choose_source(config: FetchConfig, team_mirror: Path) -> tuple[str, str]:
    """(where the setting came from, the source) in the documented order; ``team_mirror`` is the shared
    folder beside the checkout."""
    if os.environ.get("SENTEVAL_MIRROR"):
        return "SENTEVAL_MIRROR", os.environ["SENTEVAL_MIRROR"]
    if config.mirror:
        return "data.mirror", str(config.mirror)
    if team_mirror.is_dir():
        return "team mirror", str(team_mirror)
    return "upstream", config.upstream


def portable_source(source: str, team_mirror: Path) -> str:
    """How the source record names a source: a URL as it is, a local folder or tarball without its absolute
    path (a log line and data/raw.source.json; MANIFEST.json holds only the files' sha256)."""
    if source.split("://", 1)[0] in ("http", "https"):
        return source
    path = Path(source.removeprefix("file://")).expanduser()
    if path.resolve() == team_mirror.resolve():
        return "../shared/senteval"  # the team mirror beside every checkout
    return f"local {'folder' if path.is_dir() else 'file'} {path.name}"


def is_url(source: str) -> bool:
    return source.split("://", 1)[0] in ("http", "https", "file")


def download(url: str, target: Path, timeout: float) -> Path:
    """Download with a short connect timeout; no network gives a FetchError naming the URL, never a hang."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, open(target, "wb") as out:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(
                total=total, unit="B", unit_scale=True, desc=f"download {url.rsplit('/', 1)[-1]}"
            ) as bar:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
                    bar.update(len(chunk))
    except OSError as exc:  # URLError, timeouts and refused connections are all OSErrors
        reason = getattr(exc, "reason", exc)
        raise FetchError(f"cannot download {url} ({reason}); {SET_SOURCE_HINT}") from exc
    return target


def find_senteval_root(folder: Path) -> Path | None:
    """The folder holding STS/ (a tarball may wrap it in SentEval/data/downstream/ or similar)."""
    for candidate in [folder, *sorted(p.parent for p in folder.rglob("STS") if p.is_dir())]:
        if (candidate / "STS").is_dir():
            return candidate
    return None


def refuse_unsafe_members(tf: tarfile.TarFile, archive: Path, into: Path) -> None:
    root = into.resolve()
    for member in tf.getmembers():
        target = (into / member.name).resolve()
        if not target.is_relative_to(root) or not (member.isfile() or member.isdir()):
            raise FetchError(
                f"{archive.name}: refusing {member.name!r} (outside the target, a link or a device)"
            )


def unpack(archive: Path, into: Path) -> None:
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(into)
    else:
        try:
            with tarfile.open(archive) as tf:
                if hasattr(tarfile, "data_filter"):
                    tf.extractall(into, filter="data")
                else:  # Python < 3.11.4 (Debian 12's 3.11.2): the data filter's main refusals, by hand
                    refuse_unsafe_members(tf, archive, into)
                    tf.extractall(into)
        except tarfile.TarError as exc:
            raise FetchError(f"{archive.name} is neither a tar nor a zip archive ({exc})") from exc


def copy_available(root: Path, target: Path, manifest: dict[str, str], origin: str) -> None:
    """Copy the required files that ``root`` has (plus licence/readme files beside them) into ``target``."""
    for relative in required_files():
        source_file = root / relative
        if source_file.is_file() and not (target / relative).exists():
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source_file, target / relative)
            manifest[relative.as_posix()] = origin
    for folder in {r.parent for r in required_files()}:
        for extra in (root / folder).glob("*"):
            if extra.is_file() and not (target / folder / extra.name).exists() and (target / folder).is_dir():
                shutil.copyfile(extra, target / folder / extra.name)
                manifest[(folder / extra.name).as_posix()] = origin
    for extra_nli in ("SNLI", "MultiNLI"):  # train splits of a full-NLI mirror
        for path in (root / extra_nli).glob("*.train") if (root / extra_nli).is_dir() else []:
            relative = Path(extra_nli) / path.name
            if not (target / relative).exists():
                (target / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target / relative)
                manifest[relative.as_posix()] = origin


def fetch_nli_release(
    url: str, target: Path, splits: dict[str, str], config: FetchConfig, scratch: Path
) -> str:
    """Download an SNLI/MultiNLI zip and write ``splits`` ({jsonl name suffix: split}) in SentEval layout."""
    archive = download(url, scratch / url.rsplit("/", 1)[-1], config.connect_timeout_s)
    with zipfile.ZipFile(archive) as zf:
        for suffix, split in splits.items():
            member = next((n for n in zf.namelist() if n.endswith(f"_{suffix}.jsonl")), None)
            if member is None:
                raise FetchError(f"{url} has no *_{suffix}.jsonl")
            lines = zf.read(member).decode("utf-8").splitlines()
            write_senteval_nli(target, split, nli_jsonl_to_senteval(lines))
    return url


def fetch(config: FetchConfig, output: Path, team_mirror: Path) -> dict:
    """Fill ``output`` from the chosen source and return the manifest. ``output`` is replaced only on success."""
    setting, source = choose_source(config, team_mirror)
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output.parent, prefix=".fetch-") as tmp:
        scratch, staging = Path(tmp) / "scratch", Path(tmp) / "raw"
        scratch.mkdir()
        staging.mkdir()
        origins: dict[str, str] = {}

        if is_url(source):
            unpack(
                download(source, scratch / "senteval-archive", config.connect_timeout_s), scratch / "unpacked"
            )
            root = find_senteval_root(scratch / "unpacked")
            if root is None:
                raise FetchError(f"the archive at {source} has no STS/ folder; it is not in SentEval layout")
        else:
            root = Path(source).expanduser()
            if not root.is_dir():
                raise FetchError(f"{setting} points to {root}, which is not a folder; {SET_SOURCE_HINT}")
        copy_available(root, staging, origins, source)

        # The SimCSE tarball carries STS and SICK only; SNLI dev/test then comes from the SNLI release.
        if setting == "upstream" and not (staging / "SNLI" / "s1.dev").exists():
            fetch_nli_release(
                config.snli_upstream, staging / "SNLI", {"dev": "dev", "test": "test"}, config, scratch
            )
            for split in SNLI_SPLITS:
                for kind in ("s1", "s2", "labels"):
                    origins[f"SNLI/{kind}.{split}"] = config.snli_upstream

        if config.full_nli:
            if not (staging / "SNLI" / "s1.train").exists():
                fetch_nli_release(config.snli_upstream, staging / "SNLI", {"train": "train"}, config, scratch)
                origins.update({f"SNLI/{k}.train": config.snli_upstream for k in ("s1", "s2", "labels")})
            if not (staging / "MultiNLI" / "s1.train").exists():
                multinli_splits = {
                    "train": "train",
                    "dev_matched": "dev.matched",
                    "dev_mismatched": "dev.mismatched",
                }
                fetch_nli_release(
                    config.multinli_upstream, staging / "MultiNLI", multinli_splits, config, scratch
                )
                origins.update(
                    {
                        f"MultiNLI/{k}.{s}": config.multinli_upstream
                        for k in ("s1", "s2", "labels")
                        for s in multinli_splits.values()
                    }
                )

        missing = [r.as_posix() for r in required_files() if not (staging / r).is_file()]
        if missing:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            raise FetchError(f"{source} ({setting}) lacks {len(missing)} required files: {shown}")

        # What the data are, not where they came from: the manifest is part of data/raw, whose DVC hash decides
        # whether six stages rerun, so byte-identical files from another mirror must give the same bytes here.
        manifest = {
            "full_nli": config.full_nli,
            "files": {
                path.relative_to(staging).as_posix(): {
                    "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                    "bytes": path.stat().st_size,
                }
                for path in sorted(staging.rglob("*"))
                if path.is_file()
            },
        }
        (staging / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")

        previous = Path(tmp) / "previous"
        if output.exists():
            output.rename(previous)
        staging.rename(output)
    # Where the data came from, beside the output (never inside it): data/raw.source.json.
    origin = {
        "source": portable_source(source, team_mirror),
        "source_setting": setting,
        "origins": {
            path: portable_source(where, team_mirror)
            for path, where in sorted(origins.items())
            if where != source
        },
    }
    source_record(output).write_text(json.dumps(origin, indent=2) + "\n")
    return manifest | {"source": origin["source"], "source_setting": setting}


def source_record(output: Path) -> Path:
    """The record of where ``output``'s files came from, kept outside the hashed output."""
    return output.with_name(output.name + ".source.json")
