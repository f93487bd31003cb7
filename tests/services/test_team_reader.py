"""A reader of the team's stack, for real: a clone with only the tracking URI, a read-only MLflow account and the
reader's S3 key loads ``models:/<model>@champion`` and embeds, and the manifest is checked on the S3 copy.

The admin logs a tiny encoder the export stage's way and registers it (``register_candidate``: the manifest is
recorded), makes it ``champion`` and creates the reader's account with READ on the model. Then, from a
``git clone`` of this repository, a process whose environment holds nothing but ``MLFLOW_TRACKING_URI``, the
reader's ``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD`` and the reader's S3 key (``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY``) loads the champion with ``mlflow.pyfunc.load_model``, through the clone's
``sentcl_mlflow.verified_models`` (MLflow's ``models`` repository in its place), and embeds two sentences; so
does ``sentcl embed`` (``python -m stages.embed --model models:/...@champion``). The vectors are the tiny model's
own. The reader cannot move ``champion`` (PERMISSION_DENIED).

The experiment's artifacts are ``mlflow-artifacts:``: the server proxies them, so the client never touches S3
itself. The probe shows it: boto3 and botocore cannot be imported there and no S3 endpoint is set. The reader's
S3 key reads the version's bytes directly and can neither write nor delete them. One byte changed in the
weights object in S3 (the admin's key) and the reader's load is refused in one line, before any of the model's
code is imported or a weight is read; ``sentcl embed`` prints that line, exits 2 and writes nothing.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from tests.paths import ROOT
from tests.services.test_pyfunc_manifest import ENCODER, SENTENCES, register_tiny_pyfunc
from tests.services.test_team_servers import denied, s3

NAME = "sentcl-reader-test"  # a model of this test's own: the stack is shared by the session's tests
READER = ("sentcl-reader", "reader-password-for-the-team-test")
BUCKET = "sentcl-artifacts"

# Run with `python -c` in the clone, so that the clone's packages come first on sys.path ('' is its folder).
PROBE = r"""
import json, os, sys
sys.modules["boto3"] = sys.modules["botocore"] = None  # an S3 read of the client's own would fail here
import mlflow
from mlflow.exceptions import MlflowException

uri, name, version, sentences = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
out = {}
try:
    model = mlflow.pyfunc.load_model(uri)
except Exception as e:
    out["refused"] = f"{type(e).__name__}: {e}"
else:
    out["vectors"] = model.predict(sentences).tolist()
out["verifier"] = getattr(sys.modules.get("sentcl_mlflow.verified_models"), "__file__", None)
out["imported"] = sorted(m for m in ("sentence_transformers", "safetensors") if m in sys.modules)
here = os.getcwd()  # the clone: its own sentcl_mlflow/pyfunc_checks.py is the checker, not the model's code
files = [getattr(m, "__file__", None) or "" for m in list(sys.modules.values())]
out["model_code"] = sorted(
    os.path.basename(f) for f in files if f.endswith(("pyfunc_encoder.py", "pyfunc_checks.py")) and not f.startswith(here)
)
try:
    mlflow.MlflowClient().set_registered_model_alias(name, "champion", version)
    out["alias"] = "moved"
except MlflowException as e:
    out["alias"] = e.error_code
print(json.dumps(out))
"""


def s3_key(team, role: str) -> dict[str, str]:  # noqa: ANN001
    """The role's S3 key as the AWS variables (from its credentials file under the state's secrets)."""
    lines = (team["state"] / "secrets" / f"s3-{role}.ini").read_text().splitlines()
    pairs = dict(line.split("=", 1) for line in lines if "=" in line)
    return {k.strip().upper(): v.strip() for k, v in pairs.items()}


def as_reader(clone: Path, env: dict[str, str], version: str) -> dict:
    """The probe as the reader, in the clone: its one line of JSON."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE, f"models:/{NAME}@champion", NAME, version, json.dumps(SENTENCES)],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def embed(clone: Path, env: dict[str, str], folder: Path) -> subprocess.CompletedProcess:
    """``sentcl embed`` (``python -m stages.embed``) of SENTENCES with the champion, as the reader, in the clone."""
    sentences = folder / "sentences.txt"
    sentences.write_text("\n".join(SENTENCES) + "\n")
    command = [
        sys.executable,
        "-m",
        "stages.embed",
        "--input",
        str(sentences),
        "--output",
        str(folder / "v.npy"),
    ]
    return subprocess.run(
        [*command, "--model", f"models:/{NAME}@champion", "--no-progress"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_readers_clone_loads_the_champion_and_the_s3_copy_is_checked(
    team, team_mlflow_env, tiny_model, tmp_path
):
    import mlflow
    from mlflow.server import get_app_client

    from sentcl_mlflow import auth

    started = time.monotonic()
    uri = team_mlflow_env["uri"]
    # As the admin: the real registration (manifest recorded), champion, and the reader's read-only account.
    registered, expected = register_tiny_pyfunc(tiny_model, NAME)
    version = registered.rsplit("/", 1)[1]
    mlc = mlflow.MlflowClient(uri, uri)
    mlc.set_registered_model_alias(NAME, "champion", version)
    accounts = get_app_client("basic-auth", tracking_uri=uri)
    auth.ensure_user(accounts, *READER)
    auth.grant(accounts, READER[0], "registered_model", NAME, "READ")
    assert accounts.get_user_permission(READER[0], "registered_model", NAME).permission == "READ"
    manifest = json.loads(mlc.get_model_version(NAME, version).tags["sentcl.manifest"])
    weights_file = f"{ENCODER}/model.safetensors"
    assert weights_file in manifest

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=60)
    reader_key = s3_key(team, "reader")
    env = {
        "MLFLOW_TRACKING_URI": uri,
        "MLFLOW_TRACKING_USERNAME": READER[0],
        "MLFLOW_TRACKING_PASSWORD": READER[1],
        "AWS_ACCESS_KEY_ID": reader_key["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": reader_key["AWS_SECRET_ACCESS_KEY"],
    }
    loaded = as_reader(clone, env, version)
    assert "refused" not in loaded, loaded["refused"]
    np.testing.assert_allclose(np.array(loaded["vectors"]), expected, atol=1e-6)
    assert loaded["verifier"] == str(clone / "sentcl_mlflow" / "verified_models.py")  # the clone's check ran
    # What the probe sees of a model loaded: its serving code and the libraries it reads weights with.
    assert loaded["model_code"] == ["pyfunc_encoder.py"] and "safetensors" in loaded["imported"]
    assert loaded["alias"] == "PERMISSION_DENIED"
    assert mlc.get_model_version_by_alias(NAME, "champion").version == version
    # `sentcl embed` with the champion, the same way: the checked download, then the vectors.
    embedded = embed(clone, env, tmp_path)
    assert embedded.returncode == 0, embedded.stderr[-3000:]
    assert f"embed: model = champion = version {version} of {NAME}" in embedded.stdout
    np.testing.assert_allclose(np.load(tmp_path / "v.npy"), expected, atol=1e-6)

    # The version's bytes in S3 (under the server's candidates/): the reader's key reads, never writes them.
    source = mlc.get_model_version(NAME, version).source  # models:/m-<id>, the logged model
    assert source.startswith("models:/m-")
    model_id = source.removeprefix("models:/")
    admin, reader = s3(team, "admin"), s3(team, "reader")
    keys = [
        o["Key"]
        for page in admin.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="candidates/")
        for o in page.get("Contents", [])
        if f"/models/{model_id}/artifacts/" in o["Key"]
    ]
    (weights_key,) = [k for k in keys if k.endswith(f"/artifacts/{weights_file}")]
    body = reader.get_object(Bucket=BUCKET, Key=weights_key)["Body"].read()
    assert hashlib.sha256(body).hexdigest() == manifest[weights_file]
    assert denied(lambda: reader.put_object(Bucket=BUCKET, Key=weights_key, Body=b"evil")) == "AccessDenied"
    assert denied(lambda: reader.delete_object(Bucket=BUCKET, Key=weights_key)) == "AccessDenied"
    assert reader.get_object(Bucket=BUCKET, Key=weights_key)["Body"].read() == body

    # One byte of the weights changed in S3 with the admin's key: the reader's load is refused, nothing loaded.
    changed = bytearray(body)
    changed[len(changed) // 2] ^= 0x01
    admin.put_object(Bucket=BUCKET, Key=weights_key, Body=bytes(changed))
    try:
        refused = as_reader(clone, env, version)
        (tmp_path / "v.npy").unlink()
        embed_refused = embed(clone, env, tmp_path)
    finally:
        admin.put_object(Bucket=BUCKET, Key=weights_key, Body=body)
    assert refused["refused"] == (
        f"ModelTamperedError: models:/{NAME}/{version}: {weights_file} changed since registration "
        "(manifest sha256 mismatch); refusing to load it"
    )
    # None of the model's code ran, no weights were read.
    assert refused["model_code"] == [] and refused["imported"] == [] and "vectors" not in refused
    assert refused["alias"] == "PERMISSION_DENIED"
    # `sentcl embed`: exit 2, that one line on stderr, nothing written.
    assert embed_refused.returncode == 2, embed_refused.stderr[-3000:]
    assert embed_refused.stderr.strip() == "embed: " + refused["refused"].removeprefix("ModelTamperedError: ")
    assert embed_refused.stdout == "" and not (tmp_path / "v.npy").exists()
    print(f"reader test {time.monotonic() - started:.1f} s (stack and server started before)")
