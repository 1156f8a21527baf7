"""The operator attacks a sealed-mode client, live (issue #32, client side).

The stack runs on the fake-TEE harness: the worker attests as SEV-SNP through the fake kernel
interface, the test PKI (devtools/sealed_fakes) plays AMD, and the real broker, gateway and worker run
as `sealed up` runs them. The operator holds everything else: every file of the data directory (the
broker's token-signing key among them) and a proxy in front of the gateway, through which the client
talks. Each attack is refused with a typed error before the canary leaves the client, and the
canary is never seen in clear by the operator (what the proxy saw, and what it could open with its
own key).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import http.server
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import jwt
import pytest
import torch
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from starlette.testclient import TestClient

from api.broker_state import local_broker_keys
from api.home import Home
from api.stack import DEMO_ADMIN_KEY_ID, DEMO_MODEL, DEMO_TENANT, DEMO_VERSION, Stack, prepare_demo
from attestation.bundle import EvidenceBundle, RuntimeData, channel_binding, expected_report_data
from attestation.errors import FreshnessError, PolicyViolation
from attestation.token import TokenIssuer
from key_broker.policies import PolicyStore
from protocol.model_ref import ModelRef
from protocol.sealed import ReplayGuard, RequestContext, SealedError, WorkerKey, api_key_id, open_request
from protocol.sealed.http import HEADER_KEY_ID, HEADER_MODEL
from sealed_bench.gpu_models import random_checkpoint
from sealed_client import AsyncSealedOpenAI, ClientTrust, SealedOpenAI
from sealed_client.proxy import create_proxy_app
from sealed_fakes.platform import SNP_MEASUREMENT, FakePlatform
from tests.api.test_fake_tee_stack import Env, chat, put_release_policy, start
from tests.enclave_worker.demo_package import package_for_demo

CANARY = "canary-7f3a9c41d2e8b605"
PROMISES = {"prompts_logged": False, "prefix_cache_isolation": "per-tenant-salt"}


class OperatorProxy(http.server.ThreadingHTTPServer):
    """The operator's proxy in front of the gateway: forwards everything, records every request
    body, may rewrite `/.well-known/attestation`, and opens sealed requests addressed to its own key."""

    def __init__(self, gateway: str) -> None:
        super().__init__(("127.0.0.1", 0), _Forward)
        self.gateway = gateway
        self.edit: Callable[[dict], None] | None = None
        self.operator_key: WorkerKey | None = None
        self.seen: list[bytes] = []  # every request body, as it crossed the operator's network
        self.opened: list[bytes] = []  # what the operator could decrypt with its own key

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def saw_canary(self) -> bool:
        return any(CANARY.encode() in b for b in self.seen + self.opened)

    def sealed_requests(self) -> int:
        return sum(1 for b in self.seen if b.startswith(b"POST /v1/sealed"))


class _Forward(http.server.BaseHTTPRequestHandler):
    server: OperatorProxy

    def log_message(self, *_: Any) -> None:
        pass

    def _relay(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        self.server.seen.append(f"{self.command} {self.path}\n".encode() + body)
        key = self.server.operator_key
        if key is not None and self.headers.get(HEADER_KEY_ID) == key.key_id:
            # What a client that accepted the operator's key would bind (the demo's policy set is version 1).
            bearer = self.headers.get("Authorization", "").removeprefix("Bearer ")
            ctx = RequestContext(DEMO_TENANT, self.headers[HEADER_MODEL], "/v1/chat/completions", key.key_id,
                                 version=DEMO_VERSION, api_key_id=api_key_id(bearer), policy_version=1)
            self.server.opened.append(open_request(key, ctx, body, time.time(), ReplayGuard()).body)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
        answer = httpx.request(self.command, self.server.gateway + self.path, headers=headers, content=body,
                               timeout=60.0)
        content = answer.content
        if self.path == "/.well-known/attestation" and answer.status_code == 200 and self.server.edit:
            doc = answer.json()
            self.server.edit(doc)
            content = json.dumps(doc).encode()
        self.send_response(answer.status_code)
        self.send_header("content-type", answer.headers.get("content-type", "application/json"))
        self.send_header("content-length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    do_GET = do_POST = do_DELETE = _relay


@dataclasses.dataclass(frozen=True)
class Live:
    env: Env
    stack: Stack
    proxy: OperatorProxy


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    root = tmp_path_factory.mktemp("operator")
    platform = FakePlatform.create(root / "platform", gpus=1)
    home = Home(root / "home")
    package_for_demo(home, random_checkpoint("tiny", "cpu", torch.float32))
    demo = prepare_demo(home, log=lambda *_: None)
    signer = PolicyStore(home.broker).get(ModelRef(DEMO_TENANT, DEMO_MODEL, DEMO_VERSION)).required_signer
    env = Env(home, platform, demo.api_key, str(signer))
    put_release_policy(home, env.signer, require_gpu_cc=False)
    stack = start(env, "snp", "snp", "none")
    proxy = OperatorProxy(stack.gateway_url)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        assert stack.wait_ready(timeout=240) == "ready", (home.logs / "worker.log").read_text()[-3000:]
        assert chat(stack, env.api_key).status_code == 200
        yield Live(env, stack, proxy)
    finally:
        proxy.shutdown()
        stack.stop()


@pytest.fixture()
def proxy(live: Live) -> Iterator[OperatorProxy]:
    live.proxy.edit, live.proxy.operator_key = None, None
    live.proxy.seen.clear()
    live.proxy.opened.clear()
    yield live.proxy


def client_policy(live: Live) -> dict[str, Any]:
    """The demo tenant's client policy for SNP: the test PKI's roots stand in for AMD's."""
    platform = live.env.platform.root
    admin = live.env.home.tenant_policy_admin_public(DEMO_TENANT).read_text()
    return {"tenant": DEMO_TENANT, "tenant_keys": [{"key_id": DEMO_ADMIN_KEY_ID, "public_key_pem": admin}],
            "evidence": {"unsafe_roots_dir": str(platform / "roots"), "collateral_dir": str(platform / "collateral")},
            "appraisal": {"allowed_tee": ["snp"], "allowed_measurements": [SNP_MEASUREMENT.hex()]},
            "broker_jwks": json.loads((live.env.home.broker / "jwks.json").read_text()),
            "require_promises": PROMISES}


def sealed_client(live: Live, base_url: str | None = None, api_key: str | None = None, **kwargs: Any
                  ) -> SealedOpenAI:
    return SealedOpenAI(base_url=base_url or f"{live.proxy.url}/v1", api_key=api_key or live.env.api_key,
                        max_retries=0, policy=client_policy(live), **kwargs)


def ask(client: SealedOpenAI) -> Any:
    return client.chat.completions.create(model=DEMO_MODEL, max_tokens=4, temperature=0,
                                          messages=[{"role": "user", "content": CANARY}])


def remint(worker: dict, bundle: EvidenceBundle, home: Home, **scope: str) -> None:
    """The operator re-issues the broker's token for evidence of its choosing, with the broker's own
    token-signing key (sealed to the broker, but on the simulated TEE the operator holds the platform
    key that derives the sealing key: the client must not rely on the token, and does not)."""
    token_key = local_broker_keys(home).token_key
    claims = jwt.decode(worker["token"], options={"verify_signature": False})
    for registered in ("iss", "iat", "nbf", "exp", "jti", "eat_profile"):
        claims.pop(registered, None)
    claims["evidence_digest"] = bundle.digest()
    claims["runtime_data"] = {**claims["runtime_data"], "hpke_public_key": bundle.runtime_data.hpke_public_key.hex()}
    claims["sealed"] = {**claims["sealed"], **scope}
    worker["evidence"] = bundle.to_json()
    worker["token"] = TokenIssuer(token_key, "sealed-key-broker").issue(claims, dt.datetime.now(dt.UTC))


def test_the_stack_serves_the_genuine_client(live: Live, proxy: OperatorProxy) -> None:
    """The control case: the same client and proxy, untouched, verify the SNP evidence and get an answer."""
    client = sealed_client(live)
    assert ask(client).choices[0].message.content is not None
    pin = client.sealed.pinned(DEMO_MODEL)
    assert pin is not None and pin.tenant == DEMO_TENANT and pin.worker.hardware.cpu.tee.value == "snp"
    assert proxy.sealed_requests() == 1 and not proxy.saw_canary()


def test_forged_token_for_an_operator_hpke_key_is_refused(live: Live, proxy: OperatorProxy) -> None:
    """The operator mints a valid broker token for its own HPKE key and serves it, with the worker's
    runtime data rewritten to name that key, at /.well-known/attestation."""
    operator = WorkerKey.generate()

    def forge(doc: dict) -> None:
        for worker in doc["workers"]:
            bundle = EvidenceBundle.from_json(worker["evidence"])
            forged = dataclasses.replace(bundle, runtime_data=dataclasses.replace(
                bundle.runtime_data, hpke_public_key=operator.public_bytes))
            remint(worker, forged, live.env.home)
            worker["sealed_key_id"] = operator.key_id

    proxy.edit, proxy.operator_key = forge, operator
    with pytest.raises(FreshnessError, match="REPORT_DATA"):
        ask(sealed_client(live))
    assert proxy.sealed_requests() == 0 and not proxy.saw_canary()


def other_tenants_evidence(live: Live, genuine: dict) -> tuple[dict, WorkerKey]:
    """A second tenant's worker serving a model of the same name, attested by the same (test) AMD
    hardware: its report binds its own keys and says tenant `rival`."""
    from attestation.workload import WorkloadClaims

    key, usage = WorkerKey.generate(), Ed25519PrivateKey.generate()
    usage_public = usage.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    bound = EvidenceBundle.from_json(genuine["evidence"])
    workload = WorkloadClaims.decode(bound.runtime_data.workload)
    runtime = RuntimeData(nonce=os.urandom(32), hpke_public_key=key.public_bytes,
                          channel_binding=channel_binding(b"", usage_public),
                          workload=dataclasses.replace(workload, tenant="rival").encode())
    report = live.env.platform.snp_report(expected_report_data(runtime, ()))
    bundle = EvidenceBundle(tee="snp", cpu_evidence=report, runtime_data=runtime,
                            cpu_certificates=bound.cpu_certificates)
    doc = {**genuine, "tenant": "rival", "usage_public_key": usage_public.hex(), "grpc_tls_cert": None,
           "sealed_key_id": key.key_id}
    remint(doc, bundle, live.env.home, tenant="rival")  # as the broker would for the rival's own worker
    return doc, key


def test_a_second_tenants_worker_with_the_same_model_name_is_refused(live: Live, proxy: OperatorProxy) -> None:
    rival: list[WorkerKey] = []

    def swap(doc: dict) -> None:
        other, key = other_tenants_evidence(live, doc["workers"][0])
        doc["workers"] = [other]
        rival.append(key)

    proxy.edit = swap
    with pytest.raises(PolicyViolation, match="tenant"):
        ask(sealed_client(live))
    assert rival and proxy.sealed_requests() == 0 and not proxy.saw_canary()


def test_a_tampered_evidence_byte_fails_sealed_verify(live: Live, proxy: OperatorProxy, tmp_path: Path) -> None:
    """`sealed verify` prints what the hardware evidence says; one changed byte of the report (the
    operator re-mints the token over the changed evidence) makes it fail."""
    from typer.testing import CliRunner

    from api.cli.main import build

    policy = tmp_path / "client-policy.json"
    policy.write_text(json.dumps(client_policy(live)))
    key_file = tmp_path / "api-key"
    key_file.write_text(live.env.api_key)
    args = ["verify", proxy.url, "--policy", str(policy), "--api-key-file", str(key_file)]
    result = CliRunner().invoke(build(), args)
    assert result.exit_code == 0, result.output
    assert "verified from the hardware evidence" in result.output
    assert f"measurement   {SNP_MEASUREMENT.hex()}" in result.output and "REPORT_DATA" in result.output
    assert "debug         off" in result.output and "prompts_logged=False" in result.output

    def tamper(doc: dict) -> None:
        for worker in doc["workers"]:
            bundle = EvidenceBundle.from_json(worker["evidence"])
            raw = bytearray(bundle.cpu_evidence)
            raw[0x90] ^= 1  # inside MEASUREMENT, under the report's signature
            remint(worker, dataclasses.replace(bundle, cpu_evidence=bytes(raw)), live.env.home)

    proxy.edit = tamper
    result = CliRunner().invoke(build(), args)
    assert result.exit_code == 1, result.output
    assert "NOT verified (SignatureError)" in result.output


def _refused_before_sending(proxy: OperatorProxy, call: Callable[[], Any]) -> None:
    with pytest.raises(SealedError) as raised:
        call()
    assert type(raised.value).__name__ == "UnsealedRequest"
    assert not proxy.saw_canary() and proxy.sealed_requests() == 0


def test_base_url_without_v1_is_refused(live: Live, proxy: OperatorProxy) -> None:
    _refused_before_sending(proxy, lambda: ask(sealed_client(live, base_url=proxy.url)))


def test_responses_create_is_sealed(live: Live, proxy: OperatorProxy) -> None:
    """The Responses API is a sealed endpoint: the operator's proxy sees only ciphertext."""
    before = proxy.sealed_requests()
    answer = sealed_client(live).responses.create(model=DEMO_MODEL, input=CANARY, max_output_tokens=4, temperature=0)
    assert answer.object == "response"
    assert proxy.sealed_requests() == before + 1 and not proxy.saw_canary()


def test_another_endpoint_is_refused(live: Live, proxy: OperatorProxy) -> None:
    _refused_before_sending(proxy, lambda: sealed_client(live).moderations.create(model=DEMO_MODEL, input=CANARY))


def test_async_client_refuses_too(live: Live, proxy: OperatorProxy) -> None:
    import asyncio

    async def go() -> Any:
        client = AsyncSealedOpenAI(base_url=f"{proxy.url}/v1", api_key=live.env.api_key, max_retries=0,
                                   policy=client_policy(live))
        return await client.moderations.create(model=DEMO_MODEL, input=CANARY)

    _refused_before_sending(proxy, lambda: asyncio.run(go()))


def test_a_callers_own_http_client_is_refused(live: Live, proxy: OperatorProxy) -> None:
    _refused_before_sending(proxy, lambda: ask(sealed_client(live, http_client=httpx2.Client())))


def test_sealed_proxy_refuses_what_it_cannot_seal(live: Live, proxy: OperatorProxy) -> None:
    app = create_proxy_app(f"{proxy.url}/v1", ClientTrust.from_dict(client_policy(live)))
    with TestClient(app) as local:
        answer = local.post("/v1/moderations", json={"model": DEMO_MODEL, "input": CANARY},
                            headers={"Authorization": f"Bearer {live.env.api_key}"})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "UnsealedRequest"
    assert not proxy.saw_canary()



def test_an_api_key_the_operator_makes_for_demo_is_refused(live: Live, proxy: OperatorProxy) -> None:
    """#46, attack 5a, live: the operator's management login (the gateway's JWT secret from the data
    directory) creates an API key for `demo`; the demo tenant's signed policy lists only the demo key,
    so the gateway refuses it in plaintext and the worker refuses it sealed, each naming the caller
    policy. The demo key still works both ways (the control case above, and the chat here)."""
    import openai

    from api.management.auth import issue_token

    login = issue_token((live.env.home.gateway / "jwt-secret").read_text().strip(), "ops", "operator")
    made = httpx.post(f"{live.stack.gateway_url}/admin/v1/tenants/{DEMO_TENANT}/keys", json={"name": "ops-made"},
                      headers={"Authorization": f"Bearer {login}"}, timeout=30)
    assert made.status_code == 201, made.text
    operator_key = made.json()["secret"]
    plain = chat(live.stack, operator_key)
    assert plain.status_code == 403 and plain.json()["error"]["code"] == "caller_not_allowed", plain.text
    assert "caller policy" in plain.json()["error"]["message"]
    with pytest.raises(openai.PermissionDeniedError, match="caller policy"):
        ask(sealed_client(live, api_key=operator_key))
    assert chat(live.stack, live.env.api_key).status_code == 200
