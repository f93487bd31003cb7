"""`make serve` (infra/serve.sh, what the Makefile's serve target runs) refuses secrets nobody should run with:
a value left from .env.example, a short one, a .env other users can read. Each is refused before anything
starts, so these tests run the real script without any server coming up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import ROOT

GOOD = {
    "PREFECT_AUTH_STRING": "admin:a-long-enough-prefect-pw",
    "MLFLOW_AUTH_ADMIN_PASSWORD": "a-long-enough-admin-pw",
    "MLFLOW_FLASK_SERVER_SECRET_KEY": "a-long-enough-flask-key",
    "SENTCL_REGISTRAR_PASSWORD": "a-long-enough-registrar-pw",
}
# The gate's password comes from the environment of make serve only (a .env holding it is refused).
GATE_PASSWORD = "a-long-enough-gate-pw"


def serve(tmp_path: Path, values: dict[str, str], mode: int = 0o600, **environ: str):
    """Run infra/serve.sh on a .env of ``values`` with ``mode``; everything it would create points into
    tmp_path, so a refusal can be seen to have created nothing."""
    env_file = tmp_path / "dot.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    env_file.chmod(mode)
    return run_serve(tmp_path, env_file, **environ), env_file


def run_serve(tmp_path: Path, env_file: Path, **environ: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        VENV=str(Path(sys.executable).parent.parent),
        SENTCL_ENV_FILE=str(env_file),
        SENTCL_RUN_DIR=str(tmp_path / "run"),
        SENTCL_INBOX=str(tmp_path / "inbox"),
        PREFECT_HOME=str(tmp_path / "prefect"),
        SENTCL_MLFLOW_BACKEND=f"sqlite:///{tmp_path / 'mlflow.db'}",
        PREFECT_PORT="1",  # never reached: a refusal comes first
        MLFLOW_PORT="1",
    )
    for key in (*GOOD, "SENTCL_TEAM_USER", "SENTCL_TEAM_PASSWORD", "MLFLOW_AUTH_ADMIN_USERNAME"):
        env.pop(key, None)
    env["SENTCL_GATE_PASSWORD"] = GATE_PASSWORD
    env.update(environ)
    return subprocess.run(
        ["bash", "infra/serve.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def assert_refused_before_start(out, tmp_path: Path, *words: str, secret: str | None = None) -> None:
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("serve: "), out.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    if secret is not None:
        assert secret not in out.stdout + out.stderr  # the key is named, its value never printed
    assert out.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dot.env"]  # no run dir, inbox, store, server


@pytest.mark.parametrize("key", sorted(GOOD))
def test_a_secret_still_reading_change_me_is_refused_naming_its_key(tmp_path, key):
    value = "admin:CHANGE-ME" if key == "PREFECT_AUTH_STRING" else "CHANGE-ME"
    out, _ = serve(tmp_path, {**GOOD, key: value})
    assert_refused_before_start(out, tmp_path, key, "CHANGE-ME")


def test_change_me_anywhere_and_in_any_case_is_refused(tmp_path):
    # Long enough, so only the placeholder can be what stops it; and a username counts too.
    out, _ = serve(tmp_path, {**GOOD, "SENTCL_REGISTRAR_PASSWORD": "'prefix-change-me-suffix-long'"})
    assert_refused_before_start(
        out, tmp_path, "SENTCL_REGISTRAR_PASSWORD", secret="prefix-change-me-suffix-long"
    )
    out, _ = serve(tmp_path, GOOD, SENTCL_GATE_PASSWORD="gate-Change-Me-long-enough")
    assert_refused_before_start(out, tmp_path, "SENTCL_GATE_PASSWORD", secret="gate-Change-Me-long-enough")
    out, _ = serve(tmp_path, {**GOOD, "SENTCL_TEAM_USER": "CHANGE-ME"})
    assert_refused_before_start(out, tmp_path, "SENTCL_TEAM_USER")


def test_the_environment_is_checked_as_the_file_is(tmp_path):
    """The environment wins over .env: a placeholder exported in the shell is refused too."""
    out, _ = serve(tmp_path, GOOD, MLFLOW_FLASK_SERVER_SECRET_KEY="my-CHANGE-ME-flask-key")
    assert_refused_before_start(out, tmp_path, "MLFLOW_FLASK_SERVER_SECRET_KEY", secret="my-CHANGE-ME-flask")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("MLFLOW_FLASK_SERVER_SECRET_KEY", "fifteen-chars-x"),
        ("SENTCL_REGISTRAR_PASSWORD", "registrar-pw-9"),
        ("PREFECT_AUTH_STRING", "a-long-username-here:pfx-pw-7"),  # the password is what must be long
        ("SENTCL_TEAM_PASSWORD", "team-pw"),  # optional, but checked when given
    ],
)
def test_a_secret_shorter_than_16_characters_is_refused_naming_its_key(tmp_path, key, value):
    assert len(value.partition(":")[2] if key == "PREFECT_AUTH_STRING" else value) < 16
    out, _ = serve(tmp_path, {**GOOD, key: value, "SENTCL_TEAM_USER": "teammate"})
    assert_refused_before_start(out, tmp_path, key, "16 characters", secret=value)


def test_a_short_gate_password_in_the_environment_is_refused_naming_its_key(tmp_path):
    out, _ = serve(tmp_path, GOOD, SENTCL_GATE_PASSWORD="gate-pw-9")
    assert_refused_before_start(out, tmp_path, "SENTCL_GATE_PASSWORD", "16 characters", secret="gate-pw-9")


def test_a_dot_env_holding_the_gate_password_is_refused_the_worker_could_read_it(tmp_path):
    """The worker's flow runs (and any pull step a Prefect auth string holder adds) run as this OS user: a
    gate password in .env would be theirs. Refused before anything starts, even when the environment has it."""
    out, _ = serve(tmp_path, {**GOOD, "SENTCL_GATE_PASSWORD": "a-long-gate-pw-in-the-file"})
    assert_refused_before_start(
        out, tmp_path, "SENTCL_GATE_PASSWORD", "line 5", "environment", secret="a-long-gate-pw-in-the-file"
    )


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620])
def test_a_dot_env_other_users_can_open_is_refused_and_left_as_it_is(tmp_path, mode):
    out, env_file = serve(tmp_path, GOOD, mode=mode)
    assert_refused_before_start(out, tmp_path, str(env_file), f"0{mode:o}", "chmod 600")
    assert env_file.stat().st_mode & 0o777 == mode  # refused, not changed behind the owner's back


def test_a_missing_secret_still_stops_it(tmp_path):
    out, _ = serve(tmp_path, GOOD, SENTCL_GATE_PASSWORD="")
    assert out.returncode != 0 and "SENTCL_GATE_PASSWORD" in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dot.env"]


def test_a_linked_dot_env_is_judged_by_the_file_it_points_to(tmp_path):
    """A symlink's own mode is 0777; what others can read is its target's (0600 here), so the refusal that
    comes is the placeholder's, not the mode's."""
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    target = secrets / "real.env"
    target.write_text(
        "".join(f"{k}={v}\n" for k, v in {**GOOD, "SENTCL_REGISTRAR_PASSWORD": "CHANGE-ME"}.items())
    )
    target.chmod(0o600)
    link = tmp_path / "dot.env"
    link.symlink_to(target)
    out = run_serve(tmp_path, link)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("serve: SENTCL_REGISTRAR_PASSWORD still reads CHANGE-ME"), out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dot.env", "secrets"]


@pytest.mark.parametrize("missing", sorted(GOOD))
def test_a_missing_secret_is_named_in_one_line_exit_2(tmp_path, missing):
    values = {k: v for k, v in GOOD.items() if k != missing}
    out, _ = serve(tmp_path, values)
    assert_refused_before_start(out, tmp_path, missing, "not set")


@pytest.mark.parametrize(
    ("key", "value", "rule"),
    [
        ("MLFLOW_AUTH_ADMIN_PASSWORD", " " * 20, "is blank (spaces only)"),
        ("SENTCL_REGISTRAR_PASSWORD", "'" + " " * 24 + "'", "is blank (spaces only)"),  # quoted: still spaces
        ("MLFLOW_FLASK_SERVER_SECRET_KEY", "a" * 24, "is one character repeated"),
        ("PREFECT_AUTH_STRING", "admin:" + "x" * 20, "is one character repeated"),
        ("SENTCL_TEAM_PASSWORD", "*" * 20, "is one character repeated"),  # a glob character, taken as itself
    ],
)
def test_a_blank_or_one_repeated_character_secret_is_refused_naming_its_key(tmp_path, key, value, rule):
    """Long enough, and no harder to guess than a short one: twenty spaces, one letter twenty times."""
    out, _ = serve(tmp_path, {**GOOD, key: value, "SENTCL_TEAM_USER": "teammate"})
    what = "the password of PREFECT_AUTH_STRING (user:password)" if key == "PREFECT_AUTH_STRING" else key
    assert_refused_before_start(out, tmp_path, f"{what} {rule}")
    assert value.strip(" '") not in out.stderr or not value.strip(" '")


def test_a_blank_gate_password_in_the_environment_is_refused(tmp_path):
    out, _ = serve(tmp_path, GOOD, SENTCL_GATE_PASSWORD=" " * 20)
    assert_refused_before_start(out, tmp_path, "SENTCL_GATE_PASSWORD is blank (spaces only)")


@pytest.mark.parametrize(
    ("key", "value", "rule"),
    [
        ("SENTCL_GATE_PASSWORD", "g" * 20, "is one character repeated"),
        ("SENTCL_REGISTRAR_PASSWORD", " " * 20, "is blank (spaces only)"),
        ("SENTCL_TEAM_PASSWORD", "short-pw", "is shorter than 16 characters"),
    ],
)
def test_auth_setup_refuses_the_same_passwords_before_it_reaches_a_server(key, value, rule):
    """compose's mlflow-setup runs `auth setup` with the accounts' passwords on its stdin: the same rule, one
    line, exit 2, before anything is created (no server is running here)."""
    accounts = {
        "SENTCL_GATE_USER": "sentcl-gate",
        "SENTCL_GATE_PASSWORD": GATE_PASSWORD,
        "SENTCL_REGISTRAR_USER": "sentcl-registrar",
        "SENTCL_REGISTRAR_PASSWORD": GOOD["SENTCL_REGISTRAR_PASSWORD"],
        "SENTCL_TEAM_USER": "teammate",
        key: value,
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SENTCL_", "MLFLOW_TRACKING_"))}
    env["MLFLOW_TRACKING_URI"] = "http://127.0.0.1:1"  # never reached
    out = subprocess.run(
        [sys.executable, "-m", "sentcl_mlflow.auth", "setup", "--env-stdin"],
        cwd=ROOT,
        env=env,
        input="".join(f"{k}={v}\n" for k, v in accounts.items()),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"auth: {key} {rule}"), out.stderr
