"""The gate process: the only holder of the gate's MLflow account under `make serve`.

    python -m sentcl_mlflow.registry.gatekeeper --password-stdin   # infra/serve.sh starts it so

The worker, its flow runs and their stages hold the registrar's account: they register candidates into
``registry.candidate_model_name`` and cannot move ``champion``. This process polls that model every
``--interval`` seconds; each version that is ``ready`` with no verdict yet is judged by the gate
(``gate.judge_candidate``) under the production model's promotion lease: the candidate downloaded and checked
against its registration manifest and its weights tag before anything is decided from its tags, the champion
checked the same way, both scored by the gate itself on STS-B dev, SICK-R
trial and the candidate's domain (or teacher-agreement) pairs when its registration logged some, compared by
``gate_decision``. On "promoted" the production version is the gate's own upload of exactly the files it scored
(``owned.register_owned``), verified, and ``champion`` is set there. The verdict and the gate's scores are tags
on the candidate (``gate.*``; a tampered one ``sentcl.state=refused``); one log line per decision. Every poll
it also checks the champion's stored files against its record and, when they changed, restores the previous
verified champion itself (``champion``).

Nothing the worker can write reaches it unchecked: the dev pairs (``data/processed``, a pipeline output) are
opened without following a link (``read_regular``) and copied once into the gate's own scratch (``--scratch``,
0700; `make serve`: ``.run/gate``, which the worker's sandbox cannot see).

A candidate asks for nothing but "look at me": which version, which files, which dev pairs and which rules
are the gate's. At start the process makes itself non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``), so another
process of the same (non-root) OS user cannot read its ``/proc/<pid>/environ`` or ``mem``, nor ptrace it; the
password comes on stdin, never through the environment or a file.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sentcl.registry.dev_sets import GateDevSetError, read_regular, recorded_pairs_problem
from sentcl.registry.host import clear_scratch, close_process, private_folder
from sentcl.registry.rules import READY, TAG_STATE, GateConfig, GateLimits, LeaseTimes
from sentcl.registry.verdict import TAG_DECISION, reason_tags, verdict_from_tags
from sentcl_mlflow.errors import GateRefusedError

if TYPE_CHECKING:
    from mlflow import MlflowClient

# On a candidate version: the files the gate scores it on besides its own dev pairs, logged with the
# candidate's run at registration ({"domain_dev": {"path": <artifact path>, "sha256": <digest>}}).
TAG_GATE_INPUTS = "sentcl.gate_inputs"
DOMAIN_DEV_ARTIFACT = "gate-inputs/domain_dev.tsv"


def gate_inputs_tag(domain_dev: Path) -> str:
    """What the registrar tags its candidate with when it logs ``domain_dev`` as DOMAIN_DEV_ARTIFACT."""
    digest = hashlib.sha256(Path(domain_dev).read_bytes()).hexdigest()
    return json.dumps({"domain_dev": {"path": DOMAIN_DEV_ARTIFACT, "sha256": digest}}, sort_keys=True)


def pending(mlc: MlflowClient, source: str) -> list[str]:
    """Versions of ``source`` that are ready and have no verdict yet, oldest first."""
    found = []
    for version in mlc.search_model_versions(f"name='{source}'"):
        tags = version.tags or {}
        if tags.get(TAG_STATE) == READY and TAG_DECISION not in tags:
            found.append(str(version.version))
    return sorted(found, key=int)


def _domain_dev(
    mlc: MlflowClient, source: str, version: Any, dest: Path, limits: GateLimits
) -> tuple[Path, str] | None:
    """The candidate's domain dev pairs and their sha256, downloaded from its run and checked against the digest
    recorded at registration (the shared experiment is editable by teammates: a changed file is a refusal), and
    against params ``gate:`` (a file past ``max_domain_mb`` or ``max_domain_pairs`` is a refusal, unread)."""
    import mlflow

    from sentcl_mlflow.registry.measure import refusal

    raw = (version.tags or {}).get(TAG_GATE_INPUTS)
    if not raw:
        return None
    try:
        entry = json.loads(raw)["domain_dev"]
        path = mlflow.artifacts.download_artifacts(
            run_id=version.run_id, artifact_path=entry["path"], dst_path=str(dest)
        )
        reason = recorded_pairs_problem(Path(path), entry["sha256"], limits)
    except (ValueError, KeyError, TypeError, OSError) as e:
        reason = f"its domain dev pairs are unreadable ({type(e).__name__})"
    if reason is not None:
        raise refusal(mlc, source, str(version.version), reason)
    return Path(path), entry["sha256"]


class PinnedDevPairs:
    """The validate stage's pairs table, copied once into the gate's own folder and scored from there until the
    gate stops. The worker writes ``data/processed`` (it runs the pipeline): what it writes after the gate read
    the table does not change the pairs the gate judges on, and what it plants there (a link to a secret) is
    refused, never followed (``read_regular``). Absent at start (no ``dvc repro validate`` yet), the table is
    copied the first time it is there. Only a table within ``gate.max_pairs_table_mb`` that reads as a pairs table
    with an STS-B dev split is pinned: anything else is one line, and read again at the next judgment."""

    def __init__(self, base: Path, rel: str, folder: Path, limits: GateLimits) -> None:
        self.base, self.rel = base, rel
        self.source = base / rel
        self.folder = folder
        self.limits = limits
        self.copy: Path | None = None
        self.sha256 = ""

    def path(self) -> Path:
        if self.copy is None:
            from sentcl.registry.dev_sets import MB, DevSets

            data = read_regular(self.base, self.rel, int(self.limits.max_pairs_table_mb * MB))
            if data is None:
                raise GateDevSetError(
                    f"{self.source}: no dev pairs for the gate to score models on; run `dvc repro validate` first"
                )
            copy = self.folder / "pairs.parquet"
            copy.write_bytes(data)
            try:
                DevSets.load(copy, None, self.limits)
            except GateDevSetError as e:
                copy.unlink()
                raise GateDevSetError(f"{self.source}: {str(e).split(': ', 1)[-1]}") from None
            self.copy, self.sha256 = copy, hashlib.sha256(data).hexdigest()
            print(
                f"gate: dev pairs {self.source} (sha256 {self.sha256[:12]}) read once: the gate scores on this "
                "copy until it restarts",
                flush=True,
            )
        return self.copy


def judge(
    source: str, version: str, params: Mapping[str, Any], dev_pairs: Path | None = None
) -> dict[str, Any]:
    """The gate on ``source`` version ``version`` against the production model's champion, under its lease."""
    from sentcl_mlflow.registry.evidence import approved_digests
    from sentcl_mlflow.registry.gate import judge_candidate
    from sentcl_mlflow.registry.lease import promotion_lock
    from sentcl_mlflow.registry.measure import Evidence
    from sentcl_mlflow.registry.versions import finish_unfinished
    from sentcl_mlflow.store import client

    name = GateConfig.from_params(params).model_name
    limits = GateLimits.from_params(params)
    mlc = client()
    times = LeaseTimes.from_params(params)
    with promotion_lock(name, times, mlc) as lease, tempfile.TemporaryDirectory() as tmp:
        finish_unfinished(mlc, name)
        candidate = mlc.get_model_version(source, version)
        found = _domain_dev(mlc, source, candidate, Path(tmp), limits)
        domain, digest = found if found is not None else (None, "")
        # The registrant's own pairs decide only when an operator approved exactly these bytes (evidence).
        counts = bool(digest) and digest in approved_digests(mlc, name)
        return judge_candidate(mlc, source, version, lease, params, Evidence(dev_pairs, domain, counts))


def decision_line(result: Mapping[str, Any]) -> str:
    return (
        f"gate: {result['model']} version {result['version']} {result['decision'].upper()} "
        f"(champion {result['champion_before'] or '-'} -> {result['champion_after'] or '-'}): "
        + "; ".join(result["reasons"])
    )


def verdict(mlc: MlflowClient, name: str, version: str) -> dict[str, Any] | None:
    """The gate process's verdict on ``name`` version ``version``, read from its tags; None while it has none."""
    return verdict_from_tags(mlc.get_model_version(name, version).tags or {})


def wait_for_verdict(
    name: str, version: str, timeout_s: float, poll_s: float = 2.0, say: Any = print
) -> dict[str, Any] | None:
    """What the registrar does after registering: wait (at most ``timeout_s``) for the gate's verdict.

    The wait holds no lease and writes nothing, so a tracking server that stops answering meanwhile (restarted,
    its database down: refused, reset, timed out or 5xx) does not end it: one line when it stops answering, one
    when it answers again, and the polls go on until the deadline. A server still down at the deadline raises
    its last error (the stage's one line, exit 75). Any other error ends the wait at once."""
    from sentcl_mlflow.errors import describe, unreachable
    from sentcl_mlflow.store import client

    deadline = time.monotonic() + timeout_s
    mlc, last_error, down_since = None, None, None
    while True:
        try:
            mlc = mlc or client()  # client() asks /health first: a server down at the start is an outage too
            found = verdict(mlc, name, version)
        except Exception as e:
            if not unreachable(e) or time.monotonic() >= deadline:
                raise
            if down_since is None:
                say(
                    f"register: the MLflow server stopped answering ({describe(e)}) while waiting for the "
                    f"gate's verdict on {name} version {version}; polling it until the wait ends"
                )
                down_since = time.monotonic()
            last_error, found = e, None
        else:
            if down_since is not None:
                say(f"register: the MLflow server answers again after {time.monotonic() - down_since:.0f}s")
                down_since = None
        if found is not None or time.monotonic() >= deadline:
            if found is None and down_since is not None:
                raise last_error
            return found
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))


def run(
    source: str,
    params: Mapping[str, Any],
    dev_pairs: PinnedDevPairs,
    interval_s: float,
    once: bool,
    scratch: Path | None = None,
) -> None:
    """Judge what is pending, sleep, again. A server that does not answer or a busy lease: one line, retried on
    the next poll; a refused candidate: one line (it is tagged, so not pending any more). With ``scratch`` (the
    gate's own folder), all but the pinned dev pairs is removed from it after each judgment."""
    from sentcl_mlflow.errors import one_line
    from sentcl_mlflow.store import client

    failures: dict[str, int] = {}
    said: set[str] = set()
    full = True  # the champion's every file at the first poll; its small ones and sizes at every other
    while True:
        try:
            guard_champion(params, full)
            full = False
        except Exception as e:
            known = one_line("gate", e)
            _say(said, known[1] if known else f"gate: cannot check the champion: {type(e).__name__}: {e}")
        try:
            waiting = pending(client(), source)
        except Exception as e:
            known = one_line("gate", e)
            _say(said, known[1] if known else f"gate: cannot list {source}: {type(e).__name__}: {e}")
            waiting = []
        for version in waiting:
            try:
                pairs = dev_pairs.path()  # outside the redirect: a first read of the table says so in the log
                # One line per decision: what the gate's steps print on the way ("scoring on ...") is dropped.
                with contextlib.redirect_stdout(io.StringIO()):
                    result = judge(source, version, params, pairs)
                print(decision_line(result), flush=True)
            except GateRefusedError as e:
                print(str(e), flush=True)
            except Exception as e:
                message = str(e).splitlines()[0] if str(e) else ""
                failures[version] = failures.get(version, 0) + 1
                _say(said, f"gate: {source} version {version} not judged yet: {type(e).__name__}: {message}")
                if failures[version] >= 3:  # not transient: a verdict, so nobody waits on it forever
                    _error_verdict(source, version, f"{type(e).__name__}: {message}")
            finally:
                if scratch is not None:
                    clear_scratch(scratch, keep=dev_pairs.folder)
        if once:
            return
        time.sleep(interval_s)


def guard_champion(params: Mapping[str, Any], full: bool) -> None:
    """The champion's stored files against the gate's record (``champion.champion_problem``); a champion that
    fails is refused and the previous verified one restored under the lease, one line saying so."""
    from sentcl_mlflow.registry.champion import champion_problem, restore_verified_champion
    from sentcl_mlflow.registry.lease import promotion_lock
    from sentcl_mlflow.store import client

    name = GateConfig.from_params(params).model_name
    mlc = client()
    scratch = Path(tempfile.gettempdir())
    if champion_problem(mlc, name, scratch, full) is None:
        return
    with promotion_lock(name, LeaseTimes.from_params(params), mlc) as lease:
        found = champion_problem(
            mlc, name, scratch, full=True
        )  # again, whole, now that nothing else moves it
        if found is not None:
            print(restore_verified_champion(mlc, name, found[1], lease), flush=True)


def _say(said: set[str], line: str) -> None:
    if line not in said:  # a lasting problem is one line, not one per poll
        said.add(line)
        print(line, flush=True)


def _error_verdict(source: str, version: str, reason: str) -> None:
    from sentcl_mlflow.store import client

    try:
        mlc = client()
        for key, value in reason_tags([f"the gate could not judge it: {reason}"]).items():
            mlc.set_model_version_tag(source, version, key, value)
        mlc.set_model_version_tag(source, version, TAG_DECISION, "error")
        print(f"gate: {source} version {version} ERROR (not judged after 3 tries): {reason}", flush=True)
    except Exception:
        pass  # the server is down: the version stays pending and is tried again


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="The gate process: judge the candidates model's new versions."
    )
    parser.add_argument("--password-stdin", action="store_true", help="read the gate's password from stdin")
    parser.add_argument("--user", default=os.environ.get("SENTCL_GATE_USER") or "sentcl-gate")
    parser.add_argument("--params", type=Path, help="params.yaml to read (default: the checkout's)")
    parser.add_argument("--processed", type=Path, help="folder with the validate stage's pairs.parquet")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between polls")
    parser.add_argument("--once", action="store_true", help="judge what is pending, then exit")
    parser.add_argument(
        "--scratch",
        type=Path,
        help="the gate's own scratch folder (made 0700; make serve: .run/gate, which the worker cannot see)",
    )
    args = parser.parse_args(argv)
    close_process()  # before the password is read
    scratch = None
    if args.scratch is not None:
        try:
            scratch = private_folder(args.scratch)
        except OSError as e:
            print(f"gate: {e}", file=sys.stderr)
            return 2
        left = clear_scratch(scratch)  # what a killed gate left behind
        if left:
            print(f"gate: removed {left} entries a previous gate left in {scratch}", flush=True)
        tempfile.tempdir = str(scratch)  # every download and copy of the gate goes here
    # Its log is one line per decision: no download or weight-loading progress bars around them.
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    os.environ.setdefault("TQDM_DISABLE", "1")
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\n")
        if not password:
            print("gate: no password on stdin", file=sys.stderr)
            return 2
        # Set in this process only: /proc/<pid>/environ shows the environment it started with, not this.
        os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"] = args.user, password
        del password
    from sentcl.params import read_params
    from sentcl_mlflow.store import TrackingAuthError, TrackingUnavailableError, client

    params = read_params(args.params)
    from sentcl_mlflow.store import TrackingConfig, bound_requests

    bound_requests(TrackingConfig.from_params(params))  # this process's one read, before its first request
    source = GateConfig.from_params(params).candidate_model_name
    limits = GateLimits.from_params(params)
    try:
        client()
    except TrackingAuthError as e:
        print(f"gate: {e}", file=sys.stderr)
        return 2
    except TrackingUnavailableError as e:
        print(f"gate: {e}", file=sys.stderr)
        return 75
    from sentcl.params import ROOT as PROJECT
    from sentcl.registry.dev_sets import DEV_PAIRS

    # make stop's TERM unwinds (the pinned copy's folder is removed) instead of killing the process mid-write.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with tempfile.TemporaryDirectory(prefix="sentcl-gate-") as own:
        if args.processed:  # a copy the operator pins: that folder is trusted, the file still no link
            dev_pairs = PinnedDevPairs(args.processed, "pairs.parquet", Path(own), limits)
        else:
            dev_pairs = PinnedDevPairs(PROJECT, DEV_PAIRS.relative_to(PROJECT).as_posix(), Path(own), limits)
        with contextlib.suppress(GateDevSetError):  # absent, or refused: said at the first judgment
            dev_pairs.path()
        print(f"gate: watching {source} every {args.interval:g}s as {args.user}", flush=True)
        run(source, params, dev_pairs, args.interval, args.once, scratch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
