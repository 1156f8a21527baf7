"""The gateway's OpenAI surface for agent frameworks, through the official client against stand-in
workers (tests/api/fake_worker.py): every sampling parameter is honoured or refused with a 400
naming it, and /v1/models/{id} answers in OpenAI's shape, per tenant."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from api.management.auth import issue_token
from api.stack import free_port

Q = [{"role": "user", "content": "hi"}]


@dataclass
class TwoTenants:
    url: str
    acme_key: str  # acme holds model "m"
    beta_key: str  # beta holds model "secret"

    def client(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=30)


def _worker(tmp: Path, url: str, tenant: str, model: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.api.fake_worker", "--gateway", url, "--token-file",
                             str(tmp / "gw" / "register-token"), "--tenant", tenant, "--model", model,
                             "--grpc-port", str(free_port()), "--http-port", str(free_port())],
                            stdout=open(tmp / f"{tenant}.log", "wb"), stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoTenants]:
    tmp = tmp_path_factory.mktemp("agentapi")
    (tmp / "gw").mkdir()
    for name in ("register-token", "jwt-secret"):
        (tmp / "gw" / name).write_text(os.urandom(32).hex())
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    secret = (tmp / "gw" / "jwt-secret").read_text()
    procs = [subprocess.Popen([sys.executable, "-m", "api.gateway", "--data-dir", str(tmp / "gw"), "--port",
                               str(port), "--register-token-file", str(tmp / "gw" / "register-token"),
                               "--jwt-secret-file", str(tmp / "gw" / "jwt-secret")],
                              stdout=open(tmp / "gateway.log", "wb"), stderr=subprocess.STDOUT)]  # noqa: SIM115
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/healthz", timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and procs[0].poll() is None
                time.sleep(0.2)
        keys = {}
        for tenant, model in (("acme", "m"), ("beta", "secret")):
            op = {"Authorization": f"Bearer {issue_token(secret, 'test', 'operator', None)}"}
            httpx.post(f"{url}/admin/v1/tenants", headers=op, json={"name": tenant}).raise_for_status()
            httpx.post(f"{url}/admin/v1/tenants/{tenant}/models", headers=op,
                       json={"model": model, "version": "v1"}).raise_for_status()
            admin = {"Authorization": f"Bearer {issue_token(secret, 'test', 'tenant-admin', tenant)}"}
            r = httpx.post(f"{url}/admin/v1/tenants/{tenant}/keys", headers=admin, json={"name": "app"})
            keys[tenant] = r.json()["secret"]
            procs.append(_worker(tmp, url, tenant, model))
        stack = TwoTenants(url, keys["acme"], keys["beta"])
        deadline = time.monotonic() + 60
        while not (stack.client(stack.acme_key).models.list().data and stack.client(stack.beta_key).models.list().data):
            assert time.monotonic() < deadline, "workers did not register"
            time.sleep(0.2)
        yield stack
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)


def test_retrieve_a_model_in_openais_shape_and_only_ones_own(tenants: TwoTenants) -> None:
    acme, beta = tenants.client(tenants.acme_key), tenants.client(tenants.beta_key)
    card = acme.models.retrieve("m")
    assert (card.id, card.object, card.owned_by) == ("m", "model", "acme")
    assert [m.id for m in acme.models.list().data] == ["m"]
    assert beta.models.retrieve("secret").id == "secret"
    for client, model in ((acme, "secret"), (beta, "m"), (acme, "nope")):  # another tenant's, or none at all
        with pytest.raises(openai.NotFoundError) as refused:
            client.models.retrieve(model)
        body = refused.value.response.json()["error"]
        assert body["code"] == "model_not_found" and body["type"] == "invalid_request_error"
        assert model in body["message"]
    # Another tenant's model and a model that does not exist get the same answer, byte for byte.
    h = {"Authorization": f"Bearer {tenants.acme_key}"}
    assert (httpx.get(f"{tenants.url}/v1/models/secret", headers=h).json()["error"]["message"].replace("secret", "X")
            == httpx.get(f"{tenants.url}/v1/models/nope", headers=h).json()["error"]["message"].replace("nope", "X"))
    assert httpx.get(f"{tenants.url}/v1/models/m").status_code == 401  # a key is needed


def test_every_sampling_parameter_is_taken_or_refused_by_name(tenants: TwoTenants) -> None:
    c = tenants.client(tenants.acme_key)
    ok = c.chat.completions.create(model="m", messages=Q, max_tokens=2, frequency_penalty=0.5, presence_penalty=-0.5,
                                   logit_bias={"17": -100, "42": 5}, seed=3, n=2, user="u1", logprobs=True,
                                   top_logprobs=2, stream_options=None,
                                   extra_body={"repetition_penalty": 1.1, "min_p": 0.05})
    assert len(ok.choices) == 2
    stream = c.chat.completions.create(model="m", messages=Q, max_tokens=2, stream=True,
                                       stream_options={"include_usage": True}, presence_penalty=1.0)
    assert [ch for ch in stream][-1].usage is not None
    assert c.completions.create(model="m", prompt="x", max_tokens=2, frequency_penalty=1, logit_bias={"3": 1}).choices
    for extra, name in (({"typical_p": 0.5}, "typical_p"), ({"mirostat": 2}, "mirostat"),
                        ({"frequency_penalty": 3}, "frequency_penalty"), ({"min_p": 1.5}, "min_p"),
                        ({"repetition_penalty": 0}, "repetition_penalty"),
                        ({"logit_bias": {"abc": 1}}, "logit_bias"), ({"logit_bias": {"5": 101}}, "logit_bias")):
        for chat in (True, False):
            with pytest.raises(openai.BadRequestError) as refused:
                if chat:
                    c.chat.completions.create(model="m", messages=Q, max_tokens=2, extra_body=extra)
                else:
                    c.completions.create(model="m", prompt="x", max_tokens=2, extra_body=extra)
            err = refused.value.response.json()["error"]
            assert err["param"] == name or err["param"].startswith(name + "."), (extra, err)
            assert name in err["message"]
