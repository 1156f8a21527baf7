"""SealedOpenAI against a hostile gateway: the negative table. The gateway here is a test double
(httpx2.MockTransport) in front of a worker that speaks the real protocol (protocol.sealed); the
gateway is the adversary, so it is the seam. Each case gets a typed error and nothing is served."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
import os
import time
from collections.abc import Callable
from typing import Any

import httpx2
import openai
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from attestation.bundle import EvidenceBundle, RuntimeData, channel_binding, expected_report_data
from attestation.errors import FreshnessError, ParseError, PolicyViolation, SignatureError, TokenError, UnboundClaim
from attestation.sim import SimTee
from attestation.token import TokenIssuer
from attestation.workload import WorkloadClaims
from protocol.sealed import (
    ReattestRequired,
    Receipt,
    ReceiptInvalid,
    ReplayGuard,
    RequestContext,
    RequestRejected,
    RequestReplayed,
    ResponseCorrupted,
    SealedFormatError,
    WorkerKey,
    api_key_id,
    open_request,
    sign_receipt,
)
from protocol.sealed.http import HEADER_KEY_ID, HEADER_MODEL, ResponseHead
from sealed_client import SealedOpenAI
from sealed_client.errors import PinConflict, UnsealedRequest

MEASUREMENT = "ab" * 48
PLATFORM = Ed25519PrivateKey.generate()  # the simulated TEE's "hardware" key
PLATFORM_HEX = PLATFORM.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()
ANSWER = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "m", "tee": "sim",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "secret answer"},
                       "finish_reason": "stop", "logprobs": None}],
          "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}


class Worker:
    def __init__(self) -> None:
        self.key, self.usage = WorkerKey.generate(), Ed25519PrivateKey.generate()
        self.usage_public = self.usage.public_key().public_bytes(serialization.Encoding.Raw,
                                                                 serialization.PublicFormat.Raw)
        self.replay = ReplayGuard()
        self.served = 0

    def answer(self, ctx: RequestContext, wire: bytes, receipt_edit: Callable[[dict], None] | None = None) -> bytes:
        opened = open_request(self.key, ctx, wire, time.time(), self.replay)
        sealer = opened.sealer
        out = sealer.header() + sealer.seal(ResponseHead(200, "application/json").encode())
        out += sealer.seal(json.dumps(ANSWER).encode())
        fields = dict(request_sha256=opened.request_sha256, response_sha256=sealer.hash.hexdigest(),
                      worker_key_id=self.key.key_id, tenant="acme", model="m", model_version="v1", model_digest="d",
                      policy_version=ctx.policy_version, prompt_tokens=3, completion_tokens=2, tee="sim",
                      insecure=True, issued_at=time.time(), api_key_id=ctx.api_key_id,
                      signing_key=self.usage_public.hex(), channel_spki="", evidence_sha256="e" * 64)
        if receipt_edit:
            receipt_edit(fields)
        self.served += 1
        return out + sealer.seal(sign_receipt(Receipt(**fields), self.usage), final=True)


class World:
    """Broker token key, one or two workers, and a gateway whose misbehaviour each test chooses."""

    def __init__(self) -> None:
        self.issuer = TokenIssuer(ec.generate_private_key(ec.SECP256R1()), "sealed-key-broker",
                                  ttl=dt.timedelta(minutes=5))
        self.workers = [Worker(), Worker()]
        self.serving = 0  # which worker the gateway routes to
        self.doc_edit: Callable[[dict], None] | None = None
        self.request_edit: Callable[[bytes], bytes] | None = None
        self.response_edit: Callable[[bytes], bytes] | None = None
        self.receipt_edit: Callable[[dict], None] | None = None
        self.documented = 0  # which worker /.well-known/attestation shows
        self.captured: list[bytes] = []
        self.requests: list[str] = []  # every path the gateway was sent
        self.workload = WorkloadClaims("acme", "m", "v1", "d", {"prompts_logged": False}, policy_version=1)
        self.relabel_key_id = ""  # the API key id the gateway names to the worker ("": the caller's own)
        self.token_hpke: bytes | None = None  # the key the broker's token names (default: the evidence's)

    def document(self, w: Worker, measurement: str = MEASUREMENT) -> dict[str, Any]:
        runtime = RuntimeData(nonce=os.urandom(32), hpke_public_key=w.key.public_bytes,
                              channel_binding=channel_binding(b"", w.usage_public), workload=self.workload.encode())
        report = SimTee(PLATFORM, bytes.fromhex(measurement)).get_report(expected_report_data(runtime, ()))
        bundle = EvidenceBundle(tee="sim", cpu_evidence=report, runtime_data=runtime)
        if self.token_hpke is not None:  # the operator's own key, in the runtime data and the token
            bundle = EvidenceBundle(tee="sim", cpu_evidence=report, runtime_data=dataclasses.replace(
                runtime, hpke_public_key=self.token_hpke))
        claims = {"tee": "sim", "measurement": measurement, "insecure": True, "debug": False, "tcb": {},
                  "gpus": [], "evidence_digest": bundle.digest(),
                  "runtime_data": {"hpke_public_key": bundle.runtime_data.hpke_public_key.hex()},
                  "sealed": {"tenant": self.workload.tenant, "model": "m", "version": self.workload.version}}
        doc = {"worker_id": "w1", "model": "m", "version": self.workload.version, "tenant": self.workload.tenant,
               "usage_public_key": w.usage_public.hex(), "grpc_tls_cert": None,
               "token": self.issuer.issue(claims, dt.datetime.now(dt.UTC)), "evidence": bundle.to_json(),
               "sealed_key_id": w.key.key_id, "promises": dict(self.workload.promises),
               "model_digest": self.workload.model_digest}
        if self.doc_edit:
            self.doc_edit(doc)
        return doc

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        path = request.url.path
        self.requests.append(path)
        if not path.startswith("/.well-known"):
            self.captured.append(request.read())
        if path == "/.well-known/jwks.json":
            return httpx2.Response(200, json=self.issuer.jwks())
        if path == "/.well-known/attestation":
            return httpx2.Response(200, json={"workers": [self.document(self.workers[self.documented])]})
        if path == "/v1/models":
            return httpx2.Response(200, json={"object": "list", "data": []})
        assert path == "/v1/sealed/chat/completions", path
        wire = request.read()
        if self.request_edit:
            wire = self.request_edit(wire)
        worker = self.workers[self.serving]
        # As the real gateway: the API key's id (api/store/repo.py), the worker's version and policy.
        bearer = request.headers["authorization"].removeprefix("Bearer ")
        ctx = RequestContext("acme", request.headers[HEADER_MODEL], "/v1/chat/completions",
                             request.headers[HEADER_KEY_ID], version="v1",
                             api_key_id=self.relabel_key_id or api_key_id(bearer),
                             policy_version=self.workload.policy_version)
        if ctx.key_id != worker.key.key_id:
            return httpx2.Response(409, json={"error": {"message": "gone", "type": "invalid_request_error",
                                                        "param": None, "code": "reattest_required"}})
        try:
            body = worker.answer(ctx, wire, self.receipt_edit)
        except RequestReplayed:
            return httpx2.Response(400, json={"error": {"code": "sealed_request_replayed", "message": "",
                                                        "type": "invalid_request_error", "param": None}})
        except Exception:
            return httpx2.Response(400, json={"error": {"code": "sealed_request_rejected", "message": "",
                                                        "type": "invalid_request_error", "param": None}})
        if self.response_edit:
            body = self.response_edit(body)
        return httpx2.Response(200, headers={"content-type": "application/sealed-response"}, content=body)

    def policy(self, measurements: tuple[str, ...] = (MEASUREMENT,), **policy: Any) -> dict[str, Any]:
        return {"tenant": "acme", "unsafe_no_tenant_key": True, "evidence": {"sim_platform_key": PLATFORM_HEX},
                "appraisal": {"allowed_tee": ["sim"], "allowed_measurements": list(measurements),
                              "unsafe_allow_simulated_tee": True},
                "broker_jwks": self.issuer.jwks(), **policy}

    def client(self, measurements: tuple[str, ...] = (MEASUREMENT,), base_url: str = "http://gw/v1",
               **policy: Any) -> SealedOpenAI:
        return SealedOpenAI(base_url=base_url, api_key="sk-test", policy=self.policy(measurements, **policy),
                            max_retries=0, inner_transport=httpx2.MockTransport(self.handle))


def ask(client: SealedOpenAI) -> Any:
    return client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])


def test_happy_path_verifies_seals_and_checks_the_receipt() -> None:
    world = World()
    client = ask_client = world.client()
    assert ask(ask_client).choices[0].message.content == "secret answer"
    assert b"hi" not in world.captured[0]  # the gateway saw ciphertext only
    assert client.sealed.receipts[-1].completion_tokens == 2


def _frames(body: bytes) -> tuple[bytes, list[bytes]]:
    nonce, rest, frames = body[:32], body[32:], []
    while rest:
        n = 5 + int.from_bytes(rest[1:5], "big")
        frames.append(rest[:n])
        rest = rest[n:]
    return nonce, frames


def _drop(i: int) -> Callable[[bytes], bytes]:
    def edit(body: bytes) -> bytes:
        nonce, frames = _frames(body)
        return nonce + b"".join(f for j, f in enumerate(frames) if j != i)
    return edit


def _swap(body: bytes) -> bytes:
    nonce, frames = _frames(body)
    return nonce + frames[1] + frames[0] + b"".join(frames[2:])


def _flip(at: int) -> Callable[[bytes], bytes]:
    return lambda b: b[:at] + bytes([b[at] ^ 1]) + b[at + 1:]


def _set(**changes: Any) -> Callable[[dict], None]:
    return lambda d: d.update(changes)


def _break_doc_binding(doc: dict) -> None:
    doc["sealed_key_id"] = "00" * 32


def _unsigned_token(doc: dict) -> None:
    header, payload, _sig = doc["token"].split(".")
    doc["token"] = f"{header}.{payload}." + base64.urlsafe_b64encode(b"x" * 64).decode().rstrip("=")


def _other_receipt_key(doc: dict) -> None:
    doc["usage_public_key"] = "11" * 32


def _tamper_evidence(at: int) -> Callable[[dict], None]:
    def edit(doc: dict) -> None:
        raw = bytearray(base64.b64decode(doc["evidence"]["cpu_evidence"]))
        raw[at] ^= 1
        doc["evidence"]["cpu_evidence"] = base64.b64encode(bytes(raw)).decode()
    return edit


def _other_channel_binding(doc: dict) -> None:
    doc["evidence"]["runtime_data"]["channel_binding"] = "22" * 32


NEGATIVE: dict[str, tuple[str, Any, type[Exception]]] = {
    # (what the adversary changes, the change, the typed error)
    "tampered ciphertext": ("request_edit", _flip(60), RequestRejected),
    "tampered encapsulated key": ("request_edit", _flip(3), RequestRejected),
    "response chunk dropped": ("response_edit", _drop(0), ResponseCorrupted),
    "response chunks reordered": ("response_edit", _swap, ResponseCorrupted),
    "response truncated before the receipt": ("response_edit", _drop(2), ResponseCorrupted),
    "response tampered": ("response_edit", _flip(40), ResponseCorrupted),
    "receipt over another response": ("receipt_edit", _set(response_sha256="00" * 32), ReceiptInvalid),
    "receipt for another request": ("receipt_edit", _set(request_sha256="00" * 32), ReceiptInvalid),
    "receipt for another model": ("receipt_edit", _set(model="other"), ReceiptInvalid),
    "receipt for another API key id": ("receipt_edit", _set(api_key_id="key_fedcba9876543210"), ReceiptInvalid),
    "receipt for another policy version": ("receipt_edit", _set(policy_version=2), ReceiptInvalid),
    "receipt for another model version": ("receipt_edit", _set(model_version="v2"), ReceiptInvalid),
    "receipt for another model digest": ("receipt_edit", _set(model_digest="e"), ReceiptInvalid),
    "receipt naming another signing key": ("receipt_edit", _set(signing_key="11" * 32), ReceiptInvalid),
    "receipt without an evidence reference": ("receipt_edit", _set(evidence_sha256=""), ReceiptInvalid),
    "receipt from the simulated TEE marked secure": ("receipt_edit", _set(insecure=False), ReceiptInvalid),
    "API key id relabelled by the gateway": ("relabel_key_id", "key_fedcba9876543210", RequestRejected),
    "served promises edited beside the evidence": ("doc_edit", _set(promises={"prompts_logged": True}),
                                                   UnboundClaim),
    "served version edited beside the evidence": ("doc_edit", _set(version="v2"), UnboundClaim),
    "served model digest edited beside the evidence": ("doc_edit", _set(model_digest="e"), UnboundClaim),
    "served tenant edited beside the evidence": ("doc_edit", _set(tenant="globex"), UnboundClaim),
    "sealing key not bound by the evidence": ("doc_edit", _break_doc_binding, FreshnessError),
    "receipt key not bound by the evidence": ("doc_edit", _other_receipt_key, FreshnessError),
    "token with a broken signature": ("doc_edit", _unsigned_token, TokenError),
    "measurement not in the published set": ("doc_edit", None, PolicyViolation),
    "tampered evidence byte (the report's signature)": ("doc_edit", _tamper_evidence(-1), SignatureError),
    "tampered evidence byte (the report's body)": ("doc_edit", _tamper_evidence(40), ParseError),
    "runtime data not bound by REPORT_DATA": ("doc_edit", _other_channel_binding, FreshnessError),
}


@pytest.mark.parametrize("case", list(NEGATIVE))
def test_negative_table(case: str) -> None:
    world = World()
    attr, change, error = NEGATIVE[case]
    client = world.client(measurements=("cd" * 48,)) if change is None else world.client()
    if change is not None:
        setattr(world, attr, change)
    with pytest.raises(error):
        ask(client)
    if attr in ("doc_edit", "relabel_key_id"):  # refused before anything was served
        assert world.workers[0].served == 0


def test_replayed_request_is_refused_and_nothing_served() -> None:
    world = World()
    ask(world.client())
    served = world.workers[0].served
    captured = world.captured[-1]
    world.request_edit = lambda _wire: captured  # the gateway replays yesterday's request
    with pytest.raises(RequestReplayed):
        ask(world.client())
    assert world.workers[0].served == served


def test_request_sealed_to_another_workers_key_reaches_no_one() -> None:
    """The gateway routes to worker B a request sealed to worker A: B cannot open it."""
    world = World()
    client = world.client()
    ask(client)
    world.workers[1].key = world.workers[0].key.__class__.generate()  # B: other key, same key id header
    world.serving = 1
    world.workers[1].key.key_id = world.workers[0].key.key_id  # a lying gateway forwards A's key id to B
    with pytest.raises(RequestRejected):
        ask(client)
    assert world.workers[1].served == 0


def test_key_change_is_followed_only_after_re_attestation() -> None:
    """The worker is replaced (new key): the client verifies the new document before sending to it."""
    world = World()
    client = world.client()
    ask(client)
    first = client.sealed.pinned("m")
    world.serving = world.documented = 1  # the old worker is gone; the new one is attested
    assert ask(client).choices[0].message.content == "secret answer"
    assert client.sealed.pinned("m").worker_key_id != first.worker_key_id  # type: ignore[union-attr]
    # A new key that the served document does not attest is never used.
    world.serving, world.documented, world.doc_edit = 0, 1, None
    world.workers[0] = Worker()
    with pytest.raises(ReattestRequired):
        ask(client)


def test_plaintext_success_from_the_gateway_is_refused() -> None:
    world = World()

    def plaintext(request: httpx2.Request) -> httpx2.Response:
        if request.url.path.startswith("/v1/sealed"):
            return httpx2.Response(200, json=ANSWER)
        return world.handle(request)

    client = SealedOpenAI(base_url="http://gw/v1", api_key="k", max_retries=0, inner_transport=httpx2.MockTransport(
        plaintext), policy=world.policy())
    with pytest.raises(SealedFormatError):
        ask(client)


def test_required_promise_missing_is_refused() -> None:
    world = World()
    with pytest.raises(PolicyViolation):
        ask(world.client(require_promises={"prompts_retained": False}))


def test_promises_served_beside_the_evidence_are_not_relied_on() -> None:
    """The gateway serves the promise the client requires, but the evidence does not bind it: the
    edited field is refused, and without it the requirement is unmet."""
    world = World()
    world.doc_edit = _set(promises={"prompts_logged": False, "prompts_retained": False})
    with pytest.raises(UnboundClaim, match="promises"):
        ask(world.client(require_promises={"prompts_retained": False}))
    world.doc_edit = lambda doc: doc.pop("promises")
    with pytest.raises(PolicyViolation, match="prompts_retained"):
        ask(world.client(require_promises={"prompts_retained": False}))
    assert world.workers[0].served == 0


def test_a_worker_on_a_policy_older_than_the_clients_floor_is_refused() -> None:
    world = World()
    with pytest.raises(PolicyViolation, match="policy version 1"):
        ask(world.client(min_policy_version=2))
    assert world.workers[0].served == 0
    assert ask(world.client(min_policy_version=1)).choices[0].message.content == "secret answer"


def test_a_pin_is_per_version_and_digest() -> None:
    """After (m, v1, d) was verified, a worker that shows v1 with another digest is refused, even with
    valid evidence (the package was swapped under the version name); a new version verifies."""
    world = World()
    client = world.client()
    ask(client)
    pin = client.sealed.pinned("m")
    assert pin is not None and (pin.tenant, pin.model, pin.version, pin.model_digest, pin.policy_version) == (
        "acme", "m", "v1", "d", 1)
    world.serving = world.documented = 1
    world.workload = dataclasses.replace(world.workload, model_digest="swapped")
    client.sealed.forget("m")
    served = world.workers[1].served
    with pytest.raises(PinConflict, match="swapped"):
        ask(client)
    assert world.workers[1].served == served
    world.workload = dataclasses.replace(world.workload, version="v2", model_digest="new")
    pin2 = client.sealed.pin_from("m", {"workers": [world.document(world.workers[1])]})
    assert (pin2.version, pin2.model_digest) == ("v2", "new")


def test_a_receipt_verifies_for_a_third_party_with_the_evidence_it_names() -> None:
    """The signed receipt (the Sealed-Receipt header) plus the worker's evidence: all a third party needs."""
    from sealed_client.deployment import ClientTrust
    from sealed_client.receipts import verify_receipt_with_evidence

    world = World()
    client = world.client()
    raw = client.chat.completions.with_raw_response.create(model="m", messages=[{"role": "user", "content": "hi"}])
    signed = base64.b64decode(raw.headers["Sealed-Receipt"])
    evidence = world.document(world.workers[0])["evidence"]
    trust = ClientTrust.from_dict(world.policy())
    now = dt.datetime.now(dt.UTC)
    receipt = verify_receipt_with_evidence(signed, evidence, trust, now)
    assert receipt.api_key_id == api_key_id("sk-test") and receipt.signing_key == world.workers[0].usage_public.hex()
    other = world.document(world.workers[1])["evidence"]
    with pytest.raises(ReceiptInvalid, match="does not bind the key"):
        verify_receipt_with_evidence(signed, other, trust, now)
    with pytest.raises(ReceiptInvalid, match="not the one the receipt names"):
        verify_receipt_with_evidence(signed, evidence, trust, now, exact_evidence=True)
    doc = json.loads(signed)
    doc["receipt"]["completion_tokens"] += 1
    with pytest.raises(ReceiptInvalid):
        verify_receipt_with_evidence(json.dumps(doc).encode(), evidence, trust, now)
    world.workload = dataclasses.replace(world.workload, policy_version=2)  # evidence of another policy version
    with pytest.raises(ReceiptInvalid, match="policy_version"):
        verify_receipt_with_evidence(signed, world.document(world.workers[0])["evidence"], trust, now)


def test_token_for_a_key_the_evidence_does_not_bind_is_refused() -> None:
    """The broker's token signing key is the operator's: it mints a valid token for its own HPKE key
    and serves the worker's real report beside it. The report does not bind that key."""
    world = World()
    operator = WorkerKey.generate()
    world.token_hpke = operator.public_bytes
    world.doc_edit = _set(sealed_key_id=operator.key_id)
    with pytest.raises(FreshnessError, match="REPORT_DATA"):
        ask(world.client())
    assert world.captured == [] and world.workers[0].served == 0


def test_worker_of_another_tenant_with_the_same_model_name_is_refused() -> None:
    world = World()
    world.workload = WorkloadClaims("other-tenant", "m", "v1", "d", {"prompts_logged": False})
    with pytest.raises(PolicyViolation, match="tenant"):
        ask(world.client())
    assert world.captured == [] and world.workers[0].served == 0


def test_evidence_without_workload_claims_is_refused() -> None:
    world = World()
    world.doc_edit = lambda doc: doc["evidence"]["runtime_data"].pop("workload")
    with pytest.raises(FreshnessError):
        ask(world.client())


def test_pin_expires_with_its_token_and_is_verified_again() -> None:
    world = World()
    now = [dt.datetime.now(dt.UTC)]
    client = SealedOpenAI(base_url="http://gw/v1", api_key="k", max_retries=0, policy=world.policy(),
                          clock=lambda: now[0], inner_transport=httpx2.MockTransport(world.handle))
    ask(client)
    ask(client)
    assert world.requests.count("/.well-known/attestation") == 1
    now[0] += dt.timedelta(minutes=6)  # past the token's 5 minutes
    with pytest.raises(TokenError):  # the served document's token has expired too: nothing is sent
        ask(client)
    assert world.requests.count("/.well-known/attestation") == 2


# -- fail closed: nothing the client cannot seal leaves it (sealed_client/routing.py)
def _plain(client: SealedOpenAI, how: str) -> Any:
    if how == "responses.create":
        return client.responses.create(model="m", input="the canary")
    if how == "moderations.create":  # an endpoint sealed mode does not serve
        return client.moderations.create(model="m", input="the canary")
    return client.chat.completions.create(model="m", messages=[{"role": "user", "content": "the canary"}])


@pytest.mark.parametrize(("how", "base_url"), [("moderations.create", "http://gw/v1"),
                                               ("chat, base_url without /v1", "http://gw")])
def test_requests_the_client_cannot_seal_are_refused_before_sending(how: str, base_url: str) -> None:
    world = World()
    with pytest.raises(UnsealedRequest):
        _plain(world.client(base_url=base_url), how)
    assert world.captured == []


def test_responses_create_is_sealed_not_sent_in_the_clear() -> None:
    world = World()
    with pytest.raises(AssertionError):  # the mock gateway serves sealed chat only: it was sealed and sent
        _plain(world.client(), "responses.create")
    assert "/v1/sealed/responses" in world.requests and "/v1/responses" not in world.requests
    assert world.captured and all(b"the canary" not in body for body in world.captured)


def test_embeddings_create_is_sealed_not_sent_in_the_clear() -> None:
    world = World()
    with pytest.raises(AssertionError):  # the mock gateway serves sealed chat only: it was sealed and sent
        world.client().embeddings.create(model="m", input="the canary")
    assert "/v1/sealed/embeddings" in world.requests and "/v1/embeddings" not in world.requests
    assert world.captured and all(b"the canary" not in body for body in world.captured)


def test_a_callers_own_http_client_is_refused() -> None:
    world = World()
    own = httpx2.Client(transport=httpx2.MockTransport(world.handle))
    with pytest.raises(UnsealedRequest, match="http_client"):
        SealedOpenAI(base_url="http://gw/v1", api_key="k", policy=world.policy(), http_client=own)
    assert world.captured == []


def test_plaintext_only_when_explicitly_asked_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    world = World()
    client = SealedOpenAI(base_url="http://gw/v1", api_key="k", max_retries=0, policy=world.policy(),
                          inner_transport=httpx2.MockTransport(world.handle), unsafe_allow_plaintext=True)
    assert "UNSAFE" in caplog.text
    with pytest.raises(Exception):  # noqa: B017 - the mock gateway knows no /v1/moderations: it was sent
        _plain(client, "moderations.create")
    assert world.requests[-1] == "/v1/moderations"
    assert world.client().models.list().data == []  # content-free: passes through


def test_gateway_errors_pass_through_as_openai_errors() -> None:
    def deny(request: httpx2.Request) -> httpx2.Response:
        if request.url.path.startswith("/v1/sealed"):
            return httpx2.Response(429, json={"error": {"message": "slow down", "type": "rate_limit_exceeded",
                                                        "param": None, "code": "rate_limit_exceeded"}})
        return world.handle(request)

    world = World()
    client = world.client()
    client._client._transport._inner = httpx2.MockTransport(deny)  # type: ignore[attr-defined]
    with pytest.raises(openai.RateLimitError):
        ask(client)


# -- published reference values (attestation/refvalues.py): the client pins the publisher, not hashes
PUBLISHER = Ed25519PrivateKey.generate()
PUBLISHER_HEX = PUBLISHER.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def _published(world: World, envelope: Any, clock: Callable[[], dt.datetime] | None = None,
               **refs: Any) -> SealedOpenAI:
    """A client pinning PUBLISHER; the gateway serves `envelope` (a list: the one served now is its last)."""
    def handle(request: httpx2.Request) -> httpx2.Response:
        served = envelope[-1] if isinstance(envelope, list) else envelope
        if request.url.path == "/.well-known/reference-values":
            return httpx2.Response(404, json={}) if served is None else httpx2.Response(200, json=served)
        return world.handle(request)

    trust = world.policy((), reference_values={"publisher_key": PUBLISHER_HEX, **refs})
    return SealedOpenAI(base_url="http://gw/v1", api_key="k", max_retries=0, policy=trust, clock=clock,
                        inner_transport=httpx2.MockTransport(handle))


def _statement(measurements: list[str], *, key: Ed25519PrivateKey = PUBLISHER, issued_days_ago: float = 0,
               valid_days: float = 30, serial: int = 5, promises: dict[str, Any] | None = None) -> dict[str, Any]:
    from attestation.refvalues import sign_reference_values

    return sign_reference_values(key, measurements, tee="sim", valid_for=dt.timedelta(days=valid_days),
                                 issued_at=dt.datetime.now(dt.UTC) - dt.timedelta(days=issued_days_ago),
                                 serial=serial, promises=promises)


def test_measurement_in_the_signed_published_set_is_accepted() -> None:
    world = World()
    assert ask(_published(world, _statement([MEASUREMENT]))).choices[0].message.content == "secret answer"


@pytest.mark.parametrize("case", ["expired", "unsigned", "signed by another key", "not published",
                                  "measurement not in the published set", "tampered statement", "no serial",
                                  "serial below the policy's floor", "promises other than the evidence binds"])
def test_reference_value_negative_table(case: str) -> None:
    from attestation.refvalues import ReferenceValuesError

    world = World()
    envelope: Any = _statement([MEASUREMENT])
    error: type[Exception] = ReferenceValuesError
    if case == "expired":
        envelope = _statement([MEASUREMENT], issued_days_ago=31)
    elif case == "unsigned":
        envelope["signatures"] = []
    elif case == "signed by another key":
        envelope = _statement([MEASUREMENT], key=Ed25519PrivateKey.generate())
    elif case == "not published":
        envelope = None
    elif case == "measurement not in the published set":
        envelope, error = _statement(["cd" * 48]), PolicyViolation
    elif case == "tampered statement":
        body = json.loads(base64.b64decode(envelope["payload"]))
        body["subject"].append({"name": "x", "digest": {"sha384": "ef" * 48}})
        envelope["payload"] = base64.b64encode(json.dumps(body).encode()).decode()
    elif case == "no serial":  # re-signed without one
        envelope = _without_serial(_statement([MEASUREMENT]))
    elif case == "promises other than the evidence binds":
        envelope, error = _statement([MEASUREMENT], promises={"prompts_logged": True}), PolicyViolation
    refs = {"min_serial": 6} if case == "serial below the policy's floor" else {}
    with pytest.raises(error):
        ask(_published(world, envelope, **refs))
    assert world.workers[0].served == 0


def _without_serial(envelope: dict[str, Any]) -> dict[str, Any]:
    from attestation.refvalues import PAYLOAD_TYPE, _pae

    body = json.loads(base64.b64decode(envelope["payload"]))
    del body["predicate"]["serial"]
    raw = json.dumps(body).encode()
    signature = base64.b64encode(PUBLISHER.sign(_pae(PAYLOAD_TYPE, raw))).decode()
    return {**envelope, "payload": base64.b64encode(raw).decode(),
            "signatures": [{**envelope["signatures"][0], "sig": signature}]}


def test_an_older_signed_statement_is_refused_after_a_newer_one() -> None:
    """Both statements are the publisher's, unexpired and validly signed; once serial 5 was verified,
    serial 4 (which still lists a measurement since withdrawn) is refused."""
    from attestation.refvalues import StaleReferenceValues

    world = World()
    served = [_statement([MEASUREMENT], serial=5)]
    now = [dt.datetime.now(dt.UTC)]
    client = _published(world, served, clock=lambda: now[0])
    ask(client)
    served.append(_statement([MEASUREMENT, "cd" * 48], serial=4))
    now[0] += dt.timedelta(minutes=6)  # the pin expired: the deployment is verified again
    world.doc_edit = None
    with pytest.raises(StaleReferenceValues, match="serial 4"):
        ask(client)


def test_a_pin_expires_with_the_reference_values_it_was_verified_with() -> None:
    world = World()
    statement = _statement([MEASUREMENT], issued_days_ago=1, valid_days=1 + 1 / (24 * 60))  # 1 minute left
    client = _published(world, statement)
    ask(client)
    pin = client.sealed.pinned("m")
    assert pin is not None and pin.expires_at < pin.token_expires_at


def test_attest_inspect_parses_the_deployments_own_document(tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from api.cli.attest import build

    world = World()
    path = tmp_path / "attestation.json"
    path.write_text(json.dumps({"workers": [world.document(world.workers[0])]}))
    result = CliRunner().invoke(build(), ["inspect", str(path)])
    assert result.exit_code == 0, result.output
    parsed = json.loads(result.output)
    assert parsed["workers"][0]["sealed_key_id"] == world.workers[0].key.key_id
    assert parsed["workers"][0]["token_claims_unverified"]["measurement"] == MEASUREMENT


def test_the_proxy_answers_its_own_health_check_and_still_refuses_other_unsealed_paths() -> None:
    # `sealed bench serve --client vllm` waits on the proxy's /healthz; fail-closed had turned it into a
    # 400 (the benchmark never started). It is answered locally: nothing reaches the gateway.
    from starlette.testclient import TestClient

    from sealed_client.deployment import ClientTrust
    from sealed_client.proxy import create_proxy_app

    world = World()
    seen: list[str] = []

    def gateway(request: httpx2.Request) -> httpx2.Response:
        seen.append(request.url.path)
        return world.handle(request)

    app = create_proxy_app("http://gw/v1", ClientTrust.from_dict(world.policy()), httpx2.MockTransport(gateway))
    with TestClient(app) as proxy:
        health = proxy.get("/healthz")
        assert health.status_code == 200 and health.json() == {"status": "ok", "proxy": "sealed"}
        assert seen == []
        refused = proxy.get("/v1/files/file-1/content")  # a file read back would come in clear
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "UnsealedRequest"
        refused = proxy.post("/v1/vector_stores/vs-1/search", json={"query": "q"})  # no --retrieval-model
        assert refused.status_code == 400 and "retrieval_model" in refused.json()["error"]["message"]
        assert proxy.post("/healthz").status_code == 400  # only the GET is the proxy's own
        assert seen == []
