"""infra/worker-sandbox.sh on its own, the real script around a small Python program: what the worker's code
may write, read, see and signal. `make serve` under the sandbox: tests/services/test_gate_boundary.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.paths import ROOT

SANDBOX = ROOT / "infra" / "worker-sandbox.sh"

# What the program inside reports: each attempt and whether it worked.
ATTEMPTS = """
import json, os, sys
def attempt(fn):
    try:
        fn()
        return True
    except OSError:
        return False
def write(path):
    with open(path, "w") as f:
        f.write("x")
"""
PROBE = (
    ATTEMPTS
    + """
checkout, outsider = sys.argv[1], int(sys.argv[2])
print(json.dumps({
    "output": attempt(lambda: write(os.path.join(checkout, "out", "made.txt"))),
    "checkout": attempt(lambda: write(os.path.join(checkout, "code.py"))),
    "venv": attempt(lambda: write(os.path.join(os.path.dirname(sys.executable), "planted"))),
    "tmpdir": attempt(lambda: write(os.path.join(os.environ["TMPDIR"], "scratch"))),
    "secret": open(os.path.join(checkout, ".env")).read(),
    "run_dir": os.listdir(os.path.join(checkout, ".run")),
    "signal_outsider": attempt(lambda: os.kill(outsider, 0)),
    "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "capabilities": open("/proc/self/status").read().split("CapEff:")[1].split()[0],
}))
"""
)


def _checkout(tmp_path: Path) -> Path:
    checkout = tmp_path / "checkout"
    (checkout / "out").mkdir(parents=True)
    (checkout / ".run").mkdir()
    (checkout / ".run" / "users.db").write_text("password hashes")
    (checkout / ".env").write_text("MLFLOW_AUTH_ADMIN_PASSWORD=secret-of-the-operator\n")
    (checkout / "code.py").write_text("print('the gate')\n")
    return checkout


def _sandboxed(checkout: Path, *command: str, **kwargs) -> subprocess.Popen:
    options = ["--writable", "out", "--hide", ".env", "--hide", ".run"]
    # The interpreter lives in this repository's venv, outside the fake checkout: kept in sight when the repository
    # sits under /tmp, which the sandbox covers (a real worker runs from its checkout, which it always keeps).
    options += ["--keep", sys.prefix]
    return subprocess.Popen(
        ["bash", str(SANDBOX), *options, "--", *command], cwd=checkout, text=True, **kwargs
    )


def test_the_sandboxed_program_writes_its_outputs_and_nothing_that_reaches_the_gate(tmp_path):
    checkout = _checkout(tmp_path)
    outsider = subprocess.Popen(["sleep", "60"])  # the gate's stand-in: a process outside the sandbox
    try:
        run = _sandboxed(
            checkout,
            sys.executable,
            "-c",
            PROBE,
            str(checkout),
            str(outsider.pid),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = run.communicate(timeout=60)
    finally:
        outsider.kill()
    assert run.returncode == 0, err
    found = json.loads(out)
    assert found["output"] and found["tmpdir"]
    assert not found["checkout"] and not found["venv"]  # read-only: the code the gate runs stays as it is
    assert found["secret"] == "" and found["run_dir"] == []  # covered
    assert not found["signal_outsider"]  # another PID namespace: the outsider does not exist there
    assert len(found["pids"]) <= 3, found["pids"]  # the namespace's first process, the program (and bash)
    assert int(found["capabilities"], 16) == 0
    assert (checkout / "out" / "made.txt").read_text() == "x"
    assert (checkout / "code.py").read_text() == "print('the gate')\n"
    assert "secret-of-the-operator" in (checkout / ".env").read_text()  # outside, nothing was lost


def test_a_missing_writable_path_starts_nothing_in_one_line(tmp_path):
    checkout = _checkout(tmp_path)
    marker = tmp_path / "started"
    run = subprocess.run(
        ["bash", str(SANDBOX), "--writable", "missing", "--", "touch", str(marker)],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "missing does not exist" in lines[0], run.stderr
    assert not marker.exists()


@pytest.mark.parametrize("sent", [signal.SIGTERM, signal.SIGINT])
def test_make_stops_signal_reaches_the_program_inside(tmp_path, sent):
    """make stop signals the leader it recorded; the program inside must get it (TERM, then INT) and exit."""
    checkout = _checkout(tmp_path)
    program = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
        "print('ready', flush=True)\n"
        "try:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    sys.exit(0)\n"
    )
    # As make serve starts it: its own session, INT not ignored (env --default-signal=INT).
    run = subprocess.Popen(
        ["env", "--default-signal=INT", "bash", str(SANDBOX), "--writable", "out", "--keep", sys.prefix, "--"]
        + [sys.executable, "-c", program],
        cwd=checkout,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert run.stdout.readline().strip() == "ready"
        started = time.monotonic()
        os.kill(run.pid, sent)
        assert run.wait(timeout=30) == 0
        assert time.monotonic() - started < 30
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)


def test_an_ordinary_user_gets_the_same_sandbox_through_a_user_namespace(tmp_path):
    """make serve as an ordinary user: no mount without a user namespace (unshare --user --map-root-user)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to become an ordinary user (nobody) for the test")
    import shutil
    import tempfile

    home = Path(
        tempfile.mkdtemp(prefix="sandbox-nobody-")
    )  # under /tmp, outside root's private pytest folder
    try:
        checkout = _checkout(home)
        shutil.chown(home, "nobody", "nogroup")
        for path in [checkout, *checkout.rglob("*")]:
            shutil.chown(path, "nobody", "nogroup")
        home.chmod(0o755)
        # An interpreter that user may run (a venv's may link into root's own home).
        python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
        run = subprocess.run(
            ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]
            + ["bash", str(SANDBOX), "--writable", "out", "--hide", ".env", "--hide", ".run", "--"]
            + [python, "-c", PROBE, str(checkout), "1"],
            cwd=checkout,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if (
            run.returncode == 2
        ):  # no unprivileged user namespaces (or no interpreter): refused, never unsandboxed
            assert len(run.stderr.strip().splitlines()) == 1 and "worker-sandbox:" in run.stderr, run.stderr
            return
        assert run.returncode == 0, run.stderr
        found = json.loads(run.stdout)
        assert found["output"] and not found["checkout"] and not found["venv"]
        assert found["secret"] == "" and found["run_dir"] == []
        assert int(found["capabilities"], 16) == 0 and len(found["pids"]) <= 3
        assert (checkout / "out" / "made.txt").stat().st_uid == 65534  # written as that user, outside
    finally:
        shutil.rmtree(home, ignore_errors=True)


UNPRIVILEGED = "sentcl-sandbox-test"  # made with useradd by the test that needs it (root only)

PRIVATE = (
    ATTEMPTS
    + """
home, planted = sys.argv[1], sys.argv[2]
mounts = {line.split()[1]: line.split()[3].split(",") for line in open("/proc/self/mounts")}
print(json.dumps({
    "uid": os.getuid(),
    "output": attempt(lambda: write(os.path.join("out", "made.txt"))),
    "tmp": sorted(os.listdir("/tmp")),
    "planted_seen": os.path.exists(planted),
    "tmp_writable": attempt(lambda: write("/tmp/scratch")),
    "home": sorted(os.listdir(home)),
    "kept": sorted(os.listdir(os.path.join(home, "tools", "bin"))),
    "nodev": sorted(path for path in ("/tmp", "/dev/shm", os.path.abspath("out")) if "nodev" in mounts.get(path, [])),
}))
"""
)


def test_as_root_the_sandbox_runs_as_an_unprivileged_account_with_a_private_tmp(tmp_path):
    """make serve as root: --user runs the command as an unprivileged account; /tmp is its own (what another
    process leaves there, a gate's download say, is not in sight), the operator's home is covered but for the
    paths the command needs (--keep), and what it may write is nodev."""
    import pwd
    import shutil
    import tempfile

    if os.geteuid() != 0:
        pytest.skip("needs root to switch to an unprivileged account")
    if subprocess.run(["id", "-u", UNPRIVILEGED], capture_output=True).returncode != 0:
        subprocess.run(
            [
                "useradd",
                "--system",
                "--user-group",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                UNPRIVILEGED,
            ],
            check=True,
        )
    account = pwd.getpwnam(UNPRIVILEGED)
    base = Path(tempfile.mkdtemp(prefix="sandbox-user-"))  # under /tmp, outside root's private pytest folder
    home = Path(
        tempfile.mkdtemp(prefix="operator-home-")
    )  # the operator's home: history, profile, a kept tool
    planted = (
        Path(tempfile.mkdtemp(prefix="sentcl-gate-")) / "pairs.parquet"
    )  # another process's file in /tmp
    try:
        checkout = _checkout(base)
        base.chmod(0o755)
        shutil.chown(checkout / "out", UNPRIVILEGED)
        (home / ".bash_history").write_text("export SENTCL_GATE_PASSWORD=typed-in-a-shell\n")
        (home / "tools" / "bin").mkdir(parents=True)
        (home / "tools" / "bin" / "tool").write_text("a program the command needs")
        (home / "tools" / "notes").write_text("not needed")
        home.chmod(0o700)
        planted.write_text("the gate's copy")
        planted.parent.chmod(0o755)
        planted.chmod(0o644)
        python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
        run = subprocess.run(
            ["bash", str(SANDBOX), "--writable", "out", "--hide", ".env", "--cover", str(home)]
            + ["--keep", str(home / "tools" / "bin"), "--user", UNPRIVILEGED, "--", python, "-c", PRIVATE]
            + [str(home), str(planted)],
            cwd=checkout,
            capture_output=True,
            text=True,
            timeout=60,
            umask=0o077,  # make serve's: the folders on the way to a kept path must still be traversable
        )
        assert run.returncode == 0, run.stderr
        found = json.loads(run.stdout)
        assert found["uid"] == account.pw_uid != 0
        assert found["output"] and (checkout / "out" / "made.txt").stat().st_uid == account.pw_uid
        # Only the ways to what it needs are bound back: the checkout's and the kept tool's.
        assert not found["planted_seen"] and found["tmp"] == sorted([base.name, home.name])
        assert found["tmp_writable"] and not Path("/tmp/scratch").exists()  # its own /tmp, not the host's
        assert found["home"] == ["tools"] and found["kept"] == ["tool"]  # no history, no profile
        assert found["nodev"] == sorted(["/tmp", "/dev/shm", str(checkout / "out")])
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(planted.parent, ignore_errors=True)
