"""Issue 58, item 2, for real: registered-model names that read like another are refused by the MLflow server
of infra/mlflow-server.sh (its basic-auth app, the name rule of sentcl_mlflow.auth), over HTTP, as the
registrar's account that make serve's flows hold. Nothing mocked; the server is test_auth's."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import pytest

from sentcl.params import read_params
from sentcl.registry.rules import GateConfig
from sentcl_mlflow import auth, store
from tests.services.test_auth import ADMIN, CONFIG, GATE, STORES, as_user, auth_server  # noqa: F401 (fixture)

REGISTRAR = ("sentcl-registrar", "registrar-secret-for-tests-1")
PRODUCTION = GateConfig.from_params(read_params()).model_name  # the server protects params.yaml's names
assert PRODUCTION == "sentcl-encoder"
LOOKALIKES = {
    "case": "Sentcl-Encoder",
    "trailing-space": "sentcl-encoder ",
    "hyphen-u2010": "sentcl\u2010encoder",
    "en-dash-u2013": "sentcl\u2013encoder",
    "fullwidth-s": "\uff53entcl-encoder",
    "cyrillic-ie": "s\u0435ntcl-encoder",  # CYRILLIC SMALL LETTER IE among Latin letters
    "cyrillic-dze": "\u0455entcl-encoder",
}


def api(uri: str, user: tuple[str, str], path: str, body: object) -> tuple[int, str, bytes]:
    """(status, content type, raw body) of one POST to MLflow's REST API as ``user``."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{uri}{path}",
        data=data,
        headers={
            "Content-Type": "application/json",
            "Authorization": "Basic " + base64.b64encode(":".join(user).encode()).decode(),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read()


def refused_in_one_line(answer: tuple[int, str, bytes]) -> str:
    status, content_type, raw = answer
    assert status == 400 and content_type.startswith("application/json"), answer
    assert b"\n" not in raw.strip(), raw
    body = json.loads(raw)
    assert body["error_code"] == "INVALID_PARAMETER_VALUE", body
    assert "registered-model names must be in canonical form" in body["message"], body
    return body["message"]


@pytest.fixture(scope="module")
def registrar(auth_server, tmp_path_factory):  # noqa: F811 (the imported fixture)
    """make serve's setup with a registrar account (test_auth's names), as the admin."""
    with pytest.MonkeyPatch.context() as env:
        as_user(env, ADMIN)
        for key, value in {
            "SENTCL_GATE_USER": GATE[0],
            "SENTCL_GATE_PASSWORD": GATE[1],
            "SENTCL_REGISTRAR_USER": REGISTRAR[0],
            "SENTCL_REGISTRAR_PASSWORD": REGISTRAR[1],
        }.items():
            env.setenv(key, value)
        assert auth.setup(CONFIG)["registrar"] == REGISTRAR[0]
    return auth_server


CREATE = "/api/2.0/mlflow/registered-models/create"


@pytest.mark.parametrize("case", list(LOOKALIKES))
def test_the_registrar_cannot_create_a_lookalike_of_the_production_model(registrar, case):
    """Refused with 400 and one line naming the rule, though no model of that name exists on this server:
    params.yaml's production name is protected; and the lookalike was not made."""
    name = LOOKALIKES[case]
    message = refused_in_one_line(api(registrar, REGISTRAR, CREATE, {"name": name}))
    assert repr(name) in message and "'sentcl-encoder'" in message, message
    with pytest.MonkeyPatch.context() as env:
        as_user(env, ADMIN)
        names = {m.name for m in store.client().search_registered_models()}
    assert name not in names


def test_other_routes_and_encodings_of_a_lookalike_are_refused_too(registrar):
    """The UI's ajax route, a double-encoded body (which MLflow decodes twice), the admin itself, and a
    lookalike of an existing model (test_auth's candidates model, which setup created)."""
    ajax = "/ajax-api/2.0/mlflow/registered-models/create"
    refused_in_one_line(api(registrar, REGISTRAR, ajax, {"name": "Sentcl-Encoder"}))
    refused_in_one_line(
        api(registrar, REGISTRAR, CREATE, json.dumps(json.dumps({"name": "SENTCL-ENCODER"})).encode())
    )
    refused_in_one_line(api(registrar, ADMIN, CREATE, {"name": "sentcl-encoder\u200b"}))
    message = refused_in_one_line(api(registrar, REGISTRAR, CREATE, {"name": "Auth-Candidates"}))
    assert "'auth-candidates'" in message


def test_a_distinct_canonical_name_is_still_created_and_cannot_be_renamed_into_a_lookalike(registrar):
    """MLflow lets any account create a model (it then holds MANAGE on it): the rule takes nothing away from a
    name that reads differently. Renaming it to a lookalike is refused, and it keeps its name."""
    status, _, raw = api(registrar, REGISTRAR, CREATE, {"name": "registrar-scratch-model"})
    assert status == 200, raw
    rename = "/api/2.0/mlflow/registered-models/rename"
    body = {"name": "registrar-scratch-model", "new_name": "sentcl\u2013encoder"}
    assert refused_in_one_line(api(registrar, REGISTRAR, rename, body)).startswith("new_name: ")
    with pytest.MonkeyPatch.context() as env:
        as_user(env, REGISTRAR)
        assert (
            store.client().get_registered_model("registrar-scratch-model").name == "registrar-scratch-model"
        )
        store.client().delete_registered_model("registrar-scratch-model")


def test_a_lookalike_made_before_the_rule_gets_no_version_and_no_champion(registrar, tmp_path):
    """A "Sentcl-Encoder" already in the store (written behind the server's back, as one made before the rule),
    its creator's MANAGE on it: the registrar can neither register a version into it nor set its champion."""
    import mlflow

    behind = mlflow.MlflowClient(tracking_uri=STORES[registrar], registry_uri=STORES[registrar])
    behind.create_registered_model("Sentcl-Encoder")
    behind.create_model_version("Sentcl-Encoder", str(tmp_path))
    with pytest.MonkeyPatch.context() as env:
        as_user(env, ADMIN)
        auth.grant(auth._auth_client(), REGISTRAR[0], "registered_model", "Sentcl-Encoder", "MANAGE")
    versions = "/api/2.0/mlflow/model-versions/create"
    refused_in_one_line(
        api(registrar, REGISTRAR, versions, {"name": "Sentcl-Encoder", "source": str(tmp_path)})
    )
    alias = "/api/2.0/mlflow/registered-models/alias"
    body = {"name": "Sentcl-Encoder", "alias": "champion", "version": "1"}
    refused_in_one_line(api(registrar, REGISTRAR, alias, body))
    assert "champion" not in behind.get_registered_model("Sentcl-Encoder").aliases
    assert len(behind.search_model_versions("name='Sentcl-Encoder'")) == 1
