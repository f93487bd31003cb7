"""Watch an inbox folder and emit a Prefect event for each file of domain text that lands there.

    python -m flows.watch [--folder inbox]     # needs PREFECT_API_URL (make serve sets it)

The deployment trigger in infra/prefect.yaml turns event ``sentcl.data.domain-text.arrived`` into a run of the
retrain deployment with ``domain_text`` = the file. A file counts as landed once its size has stopped changing
(a copy in progress is not yet text to train on). What a retrain archives to ``<inbox>/processed/`` is not news.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from sentcl.data.domain import PROCESSED_DIR
from stages.common import ROOT

EVENT = "sentcl.data.domain-text.arrived"
SETTLE_S = 2.0


def emit_arrival(path: Path) -> None:
    from prefect.events import emit_event

    path = path.resolve()
    emit_event(
        event=EVENT,
        resource={"prefect.resource.id": f"sentcl.inbox.{path.name}", "sentcl.path": str(path)},
        payload={"path": str(path), "bytes": path.stat().st_size},
    )
    print(f"watch: {EVENT} {path}", flush=True)


def wait_until_settled(path: Path, settle_s: float = SETTLE_S, timeout_s: float = 600) -> bool:
    deadline = time.monotonic() + timeout_s
    last = -1
    while time.monotonic() < deadline:
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return False
        if size == last:
            return True
        last = size
        time.sleep(settle_s)
    return False


class InboxHandler(FileSystemEventHandler):
    def __init__(self, emit=emit_arrival, settle_s: float = SETTLE_S, folder: Path | None = None) -> None:  # noqa: ANN001
        self.emit, self.settle_s = emit, settle_s
        # A retrain moves what it read into <folder>/processed/<date>/: that move is not a new file.
        self.archive = (folder / PROCESSED_DIR).resolve() if folder is not None else None
        self._pending: set[Path] = set()
        self._lock = threading.Lock()

    def _consider(self, raw: str | bytes) -> None:
        path = Path(raw.decode() if isinstance(raw, bytes) else raw)
        if path.name.startswith(".") or path.suffix in (".tmp", ".part", ".swp") or not path.is_file():
            return
        if self.archive is not None and self.archive in path.resolve().parents:
            return
        with self._lock:
            if path in self._pending:
                return
            self._pending.add(path)
        threading.Thread(target=self._settle_and_emit, args=(path,), daemon=True).start()

    def _settle_and_emit(self, path: Path) -> None:
        try:
            if wait_until_settled(path, self.settle_s):
                self.emit(path)
        finally:
            with self._lock:
                self._pending.discard(path)

    def on_created(self, event: FileSystemEvent) -> None:
        if not event.is_directory:
            self._consider(event.src_path)

    def on_moved(self, event: FileSystemEvent) -> None:
        if not event.is_directory:
            self._consider(event.dest_path)

    def on_closed(self, event: FileSystemEvent) -> None:
        if not event.is_directory:
            self._consider(event.src_path)


def watch(folder: Path, handler: InboxHandler | None = None) -> Observer:
    folder.mkdir(parents=True, exist_ok=True)
    observer = Observer()
    observer.schedule(handler or InboxHandler(folder=folder), str(folder), recursive=False)
    observer.start()
    return observer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Emit a Prefect event when domain text lands in a folder.")
    parser.add_argument("--folder", type=Path, default=ROOT / "inbox")
    args = parser.parse_args(argv)
    from flows.common import check_prefect_api, cli_errors

    with cli_errors("watch"):  # the events go to that server: it must answer now (75 when it does not)
        check_prefect_api()
    observer = watch(args.folder)
    print(f"watch: watching {args.folder.resolve()} for new domain text", flush=True)
    try:
        while observer.is_alive():
            observer.join(1)
    except KeyboardInterrupt:
        pass
    finally:
        observer.stop()
        observer.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
