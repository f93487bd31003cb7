"""The promotion lease: one promotion (or rollback) at a time per registered model, across machines."""

from __future__ import annotations

import getpass
import os
import random
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from sentcl.registry.host import TAG_HOLDER, holder_gone, holder_identity
from sentcl.registry.rules import LeaseTimes
from sentcl_mlflow import runs
from sentcl_mlflow.errors import PromotionLockTimeout, describe, unreachable
from sentcl_mlflow.registry.names import mlflow_error_code
from sentcl_mlflow.store import (
    TrackingAuthError,
    TrackingUnavailableError,
    client,
    quick_requests,
    tracking_uri,
)

if TYPE_CHECKING:
    from mlflow import MlflowClient

LEASE_SUFFIX = ".promotion-lease"


class PromotionLeaseDenied(TrackingAuthError):
    """This account may not take the promotion lease (only the gate's account may promote). Not transient:
    every caller that reports refused credentials in one line reports this one too."""


class PromotionLeaseLost(PromotionLockTimeout):
    """The lease was broken (expired while this process was still working); nothing more is written.
    Transient, like a lease that stayed busy: a retry takes a fresh lease."""


LEASE_SOURCE = "sentcl-lease:/promotion-lease"  # never read: a lease version has no files
# On every MLflow run started while a lease is held: the lease model and the holder's token (version).
TAG_RUN_LEASE, TAG_RUN_TOKEN = "sentcl.lease_model", "sentcl.lease_token"


class Lease:
    """A held promotion lease: version ``token`` of the lease model. The version number is the fencing
    token (the server hands them out in order, atomically). ``renew`` touches the version (the server stamps
    ``last_updated_timestamp``, its own clock) and fails once someone broke the lease by deleting it."""

    def __init__(self, mlc: MlflowClient, model: str, token: str, lease_s: float) -> None:
        self.mlc, self.model, self.token, self.lease_s = mlc, model, token, lease_s
        self._renewals = 0
        self._lost: BaseException | None = None
        self._lock = threading.Lock()

    def renew(self) -> int:
        """Touch the version; returns the server's time of the touch (ms). Raises PromotionLeaseLost."""
        from mlflow.exceptions import MlflowException

        with self._lock:
            if self._lost is not None:
                raise PromotionLeaseLost(f"promotion lease {self.model} token {self.token} was lost")
            self._renewals += 1
            try:
                mv = self.mlc.update_model_version(
                    self.model, self.token, description=f"held; renewal {self._renewals}"
                )
            except MlflowException as e:
                if mlflow_error_code(e) == "RESOURCE_DOES_NOT_EXIST":
                    self._lost = e
                    raise PromotionLeaseLost(
                        f"promotion lease {self.model} token {self.token} was broken by another process "
                        f"(it expired: not renewed within {self.lease_s:g}s)"
                    ) from None
                raise
            return int(mv.last_updated_timestamp)

    def check(self) -> None:
        """The fencing check right before a write that needs the lease (the champion alias)."""
        self.renew()


def _lease_model(mlc: MlflowClient, name: str) -> str:
    from mlflow.exceptions import MlflowException

    lease = f"{name}{LEASE_SUFFIX}"
    try:
        mlc.get_registered_model(lease)
    except MlflowException as e:
        if mlflow_error_code(e) != "RESOURCE_DOES_NOT_EXIST":
            raise
        try:  # a store without `auth setup` (the local sqlite store): the first gate creates it
            mlc.create_registered_model(
                lease, description=f"promotion lease of {name!r}: one version per holder or waiter"
            )
        except MlflowException as e2:
            if mlflow_error_code(e2) != "RESOURCE_ALREADY_EXISTS":
                raise
    return lease


@contextmanager
def promotion_lock(name: str, times: LeaseTimes, mlc: MlflowClient | None = None) -> Iterator[Lease]:
    """One promotion at a time per registered model, across every machine that reaches the store.

    The lease model ``<name>.promotion-lease`` (created by ``sentcl_mlflow.auth setup``: only the gate's
    account may edit the production one, everyone else reads it) gets one model version per contender. The
    server numbers versions atomically and in order, so the number is a queue ticket and a fencing token:
    a contender holds the lease once no lower-numbered version is left. Holders and waiters renew their
    version every ``lease_s / 3`` (a background thread while held); a version whose server-side
    ``last_updated_timestamp`` is more than ``lease_s`` behind the server's time of our own latest touch
    belongs to a dead process and is deleted, which is how a killed holder's lease breaks (one clock: the
    server's). The holder renews once more right before it moves an alias (``Lease.check``): a holder whose
    lease was broken stops there with :class:`PromotionLeaseLost`. An account without EDIT on the lease
    model is refused with :class:`PromotionLeaseDenied` and can neither take nor block it. ``times``:
    params.yaml ``promotion:`` (``lease_s``, and ``wait_s``, how long this contender waits).
    """
    from mlflow.exceptions import MlflowException

    mlc = mlc or client()
    wait_s, lease_s = times.wait_s, times.lease_s
    lease_model = _lease_model(mlc, name)
    owner = f"{socket.gethostname()}:{os.getpid()}:{getpass.getuser()}"
    try:
        token = str(
            mlc.create_model_version(
                lease_model,
                LEASE_SOURCE,
                tags={"owner": owner, "lease_s": f"{lease_s:g}", TAG_HOLDER: holder_identity()},
                description="waiting",
                # A lease version has no files to wait for; MLflow would log "Waiting up to 300 seconds".
                await_creation_for=0,
            ).version
        )
    except MlflowException as e:
        if mlflow_error_code(e) == "PERMISSION_DENIED":
            who = os.environ.get("MLFLOW_TRACKING_USERNAME") or "this account"
            raise PromotionLeaseDenied(
                f"promotion of {name!r}: {who} may not take its lease {lease_model!r}; only the gate's "
                "account (SENTCL_GATE_USER) may promote or roll back"
            ) from None
        raise
    held = Lease(mlc, lease_model, token, lease_s)
    deadline = time.monotonic() + wait_s
    try:
        while True:
            now_ms = held.renew()
            ahead = [
                v for v in mlc.search_model_versions(f"name='{lease_model}'") if int(v.version) < int(token)
            ]
            if not ahead:
                break
            for v in ahead:
                # Expired by its holder's own lease length, measured on the server's clock; or held by a process
                # of this host that has certainly exited (a crashed gate need not wait out the lease).
                if int(v.last_updated_timestamp) + _lease_length(v, lease_s) * 1000 < now_ms:
                    why = f"not renewed for {_lease_length(v, lease_s):g}s"
                else:
                    why = holder_gone(v)
                if why is None:
                    continue
                try:
                    mlc.delete_model_version(lease_model, v.version)
                    print(
                        f"registry: broke the promotion lease {v.version} of "
                        f"{(v.tags or {}).get('owner', '?')} ({why})"
                    )
                except MlflowException as e:
                    if mlflow_error_code(e) != "RESOURCE_DOES_NOT_EXIST":
                        raise
            if time.monotonic() > deadline:
                holder = (ahead[0].tags or {}).get("owner", "?")
                raise PromotionLockTimeout(
                    f"promotion of {name!r}: the lease {lease_model!r} is held by {holder}; waited {wait_s:g}s"
                )
            time.sleep(min(1.0, lease_s / 6) * (0.5 + random.random()))
    except BaseException as error:
        released = _release(held, error)
        _raise_unreachable(error, name, held, released, "while waiting for")
        raise
    stop = threading.Event()

    def keep_renewing() -> None:
        while not stop.wait(lease_s / 3):
            try:
                held.renew()
            except PromotionLeaseLost:
                return
            except Exception:  # noqa: BLE001 (a missed renewal; the next one or the fencing check decides)
                pass

    renewer = threading.Thread(target=keep_renewing, name="promotion-lease", daemon=True)
    renewer.start()
    try:
        # Every run started under the lease names it: one left RUNNING (its process or the server died)
        # is ended by the next holder (fail_orphaned_runs).
        with runs.context_tags({TAG_RUN_LEASE: lease_model, TAG_RUN_TOKEN: token}):
            yield held
    except BaseException as error:
        stop.set()
        renewer.join(10)
        released = _release(held, error)
        _raise_unreachable(error, name, held, released, "while holding")
        raise
    stop.set()
    renewer.join(10)
    _release(held)


def _raise_unreachable(error: BaseException, name: str, held: Lease, released: bool, when: str) -> None:
    """A connection failure under the lease becomes one TrackingUnavailableError (exit 75 in every entry
    point) that says what became of the lease."""
    if (
        not isinstance(error, Exception)
        or not unreachable(error)
        or isinstance(error, TrackingUnavailableError)
    ):
        return
    lease = (
        f"its lease version {held.token} was released"
        if released
        else f"its lease version {held.token} of {held.model!r} expires by itself {held.lease_s:g}s after "
        "its last renewal (params promotion.lease_s)"
    )
    raise TrackingUnavailableError(
        f"MLflow tracking server {tracking_uri()} stopped answering ({describe(error)}) {when} the promotion "
        f"lease of {name!r}; {lease}; a run it left RUNNING is ended as FAILED by the next registration"
    ) from error


def _lease_length(version, default: float) -> float:  # noqa: ANN001
    try:
        return float((version.tags or {}).get("lease_s", default))
    except ValueError:
        return default


def _release(held: Lease, error: BaseException | None = None) -> bool:
    """Delete our lease version; True when it is gone. After a connection failure (``error``) the server
    gets one short try: a dead one would cost the whole bounded timeout again, for a lease that expires on
    its own anyway; the caller's one line then says so instead of a line here."""
    from mlflow.exceptions import MlflowException

    quick = error is not None and isinstance(error, Exception) and unreachable(error)
    try:
        if quick:
            with quick_requests():
                held.mlc.delete_model_version(held.model, held.token)
        else:
            held.mlc.delete_model_version(held.model, held.token)
        return True
    except MlflowException as e:
        if mlflow_error_code(e) == "RESOURCE_DOES_NOT_EXIST":
            return True
        if quick or unreachable(e):
            return False
        print(f"registry: could not release the promotion lease {held.model} {held.token}: {e.message}")
    except Exception as e:  # noqa: BLE001 (the server is gone: the lease expires on its own)
        if quick:
            return False
        print(
            f"registry: could not release the promotion lease {held.model} {held.token} "
            f"({type(e).__name__}); it expires after {held.lease_s:g}s"
        )
    return False
