"""The operator attacks the bindings of sealed mode, live (issue #32, "Bindings" and finding 4).

The same stack and operator as tests/security/test_operator_attacks.py: the real broker, gateway and
worker on the fake-TEE harness (the test PKI plays AMD), the operator holding every file of the data
directory (the reference-value publisher's key among them), the gateway's API-key table and a proxy
in front of the gateway. Each attack is refused with a typed error; nothing is served, the canary is
never seen in clear, and a refusal that reaches the gateway is in its audit log.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from api.home import Home, ed25519_key
from api.stack import DEMO_MODEL, DEMO_TENANT, DEMO_VERSION, prepare_demo
from api.store.bootstrap import ApiKeyStore
from attestation.bundle import EvidenceBundle, RuntimeData, channel_binding, expected_report_data
from attestation.errors import FreshnessError, UnboundClaim
from attestation.refvalues import StaleReferenceValues, sign_reference_values
from attestation.workload import WorkloadClaims
from key_broker.policies import PolicyStore
from protocol.model_ref import ModelRef
from protocol.sealed import RequestRejected, WorkerKey, api_key_id
from protocol.sealed.release_statement import ReleaseStatement, sign_release_statement
from sealed_bench.gpu_models import random_checkpoint
from sealed_client.errors import PinConflict
from sealed_fakes.platform import SNP_MEASUREMENT, FakePlatform
from tests.api.test_fake_tee_stack import Env, chat, put_release_policy, start
from tests.enclave_worker.demo_package import package_for_demo
from tests.security.test_operator_attacks import (
    Live,
    OperatorProxy,
    _Forward,
    ask,
    client_policy,
    remint,
    sealed_client,
)


class BindingsProxy(OperatorProxy):
    """The operator's proxy, which may also swap the API key a sealed request is sent with (for a key of
    its own of the same tenant: the gateway then names that key's id to the worker) and serve
    reference values of its choosing."""

    def __init__(self, gateway: str) -> None:
        super().__init__(gateway)
        self.RequestHandlerClass = _Relabel
        self.swap_api_key: str | None = None
        self.reference_values: dict | None = None


class _Relabel(_Forward):
    server: BindingsProxy

    def _relay(self) -> None:
        if self.path == "/.well-known/reference-values" and self.server.reference_values is not None:
            content = json.dumps(self.server.reference_values).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)
            return
        if self.path.startswith("/v1/sealed") and self.server.swap_api_key:
            del self.headers["Authorization"]
            self.headers["Authorization"] = f"Bearer {self.server.swap_api_key}"
        super()._relay()

    do_GET = do_POST = do_DELETE = _relay


@dataclasses.dataclass(frozen=True)
class BindingsLive(Live):
    operator_api_key: str  # a key of the demo tenant the operator made for itself (it holds the key table)
    proxy: BindingsProxy  # type: ignore[assignment]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BindingsLive]:
    root = tmp_path_factory.mktemp("bindings")
    platform = FakePlatform.create(root / "platform", gpus=1)
    home = Home(root / "home")
    package_for_demo(home, random_checkpoint("tiny", "cpu", torch.float32))
    demo = prepare_demo(home, log=lambda *_: None)
    operator_key = ApiKeyStore(home.gateway / "api-keys.json").create(DEMO_TENANT, "operator")
    signer = PolicyStore(home.broker).get(ModelRef(DEMO_TENANT, DEMO_MODEL, DEMO_VERSION)).required_signer
    env = Env(home, platform, demo.api_key, str(signer))
    put_release_policy(home, env.signer, require_gpu_cc=False)
    stack = start(env, "snp", "snp", "none")
    proxy = BindingsProxy(stack.gateway_url)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        assert stack.wait_ready(timeout=240) == "ready", (home.logs / "worker.log").read_text()[-3000:]
        assert chat(stack, env.api_key).status_code == 200
        yield BindingsLive(env, stack, proxy, operator_key)
    finally:
        proxy.shutdown()
        stack.stop()


@pytest.fixture()
def proxy(live: BindingsLive) -> Iterator[BindingsProxy]:
    p = live.proxy
    p.edit, p.operator_key, p.swap_api_key, p.reference_values = None, None, None, None
    p.seen.clear()
    p.opened.clear()
    yield p


def _nothing_served(proxy: OperatorProxy) -> None:
    assert not proxy.saw_canary()


def _gateway_audit(live: BindingsLive) -> list[dict[str, Any]]:
    path = live.env.home.audit / "gateway.audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_bindings_hold_for_the_genuine_client(live: BindingsLive, proxy: BindingsProxy) -> None:
    """Control: the pin carries the version, digest and policy version the evidence binds; the receipt
    names them, the API key's id, its signing key and the evidence."""
    client = sealed_client(live)
    assert ask(client).choices[0].message.content is not None
    pin = client.sealed.pinned(DEMO_MODEL)
    receipt = client.sealed.receipts[-1]
    assert pin is not None and pin.version == DEMO_VERSION and pin.model_digest and pin.policy_version >= 1
    assert (receipt.model_version, receipt.model_digest, receipt.policy_version) == (
        pin.version, pin.model_digest, pin.policy_version)
    assert receipt.api_key_id == api_key_id(live.env.api_key) and receipt.signing_key == pin.receipt_key.hex()
    assert receipt.evidence_sha256 and proxy.sealed_requests() == 1 and not proxy.saw_canary()


def test_a_relabelled_api_key_id_does_not_open(live: BindingsLive, proxy: BindingsProxy) -> None:
    """The operator sends the client's sealed request under an API key of its own (same tenant): the
    gateway names that key's id to the worker, whose per-key rules would then apply. The id is in the
    request's associated data, so the worker cannot open it; the gateway audits the refusal."""
    before = len(_gateway_audit(live))
    proxy.swap_api_key = live.operator_api_key
    with pytest.raises(RequestRejected):
        ask(sealed_client(live))
    assert proxy.sealed_requests() == 1 and not proxy.saw_canary()
    refusals = [r for r in _gateway_audit(live)[before:] if r.get("action") == "edge-refusal"]
    assert any("sealed_request_rejected" in str(r.get("reason")) for r in refusals), refusals
    worker_log = (live.env.home.logs / "worker.log").read_text()
    assert "refused: RequestRejected" in worker_log and "canary" not in worker_log


def test_edited_promises_are_refused(live: BindingsLive, proxy: BindingsProxy) -> None:
    """The operator edits the promises served beside the evidence (claiming one the worker's evidence
    does not bind), then the promises inside the runtime data itself: both are refused."""
    def beside(doc: dict) -> None:
        for worker in doc["workers"]:
            worker["promises"] = {**worker["promises"], "prompts_retained": False, "operator_audited": True}

    proxy.edit = beside
    with pytest.raises(UnboundClaim, match="promises"):
        ask(sealed_client(live))
    assert proxy.sealed_requests() == 0

    def inside(doc: dict) -> None:
        for worker in doc["workers"]:
            bundle = EvidenceBundle.from_json(worker["evidence"])
            claims = WorkloadClaims.decode(bundle.runtime_data.workload)
            edited = dataclasses.replace(claims, promises={**claims.promises, "prompts_logged": False,
                                                           "operator_audited": True})
            remint(worker, dataclasses.replace(bundle, runtime_data=dataclasses.replace(
                bundle.runtime_data, workload=edited.encode())), live.env.home)
            worker["promises"] = dict(edited.promises)

    proxy.edit = inside
    with pytest.raises(FreshnessError, match="REPORT_DATA"):
        ask(sealed_client(live))
    assert proxy.sealed_requests() == 0 and not proxy.saw_canary()


def _statement(live: BindingsLive, serial: int, measurements: list[str]) -> dict[str, Any]:
    """Signed with the stack's publisher key (a file on the operator's disk in this demo)."""
    key = ed25519_key(live.env.home.root / "publisher" / "reference-values.key")
    return sign_reference_values(key, measurements, tee="snp", issued_at=dt.datetime.now(dt.UTC),
                                 valid_for=dt.timedelta(days=30), serial=serial)


def _publisher_policy(live: BindingsLive, **refs: Any) -> dict[str, Any]:
    key = ed25519_key(live.env.home.root / "publisher" / "reference-values.key")
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    policy = client_policy(live)
    policy["appraisal"] = {**policy["appraisal"], "allowed_measurements": []}  # only what the publisher signs
    policy["reference_values"] = {"publisher_key": raw.hex(), **refs}
    return policy


def test_an_older_signed_reference_value_statement_is_refused(live: BindingsLive, proxy: BindingsProxy) -> None:
    """Serial 7 lists the worker's measurement; serial 6, older but unexpired and validly signed, also
    lists one the publisher has since withdrawn. After 7 was verified, 6 is refused; a client whose
    policy sets the floor refuses it from the start."""
    from sealed_client import SealedOpenAI

    withdrawn = os.urandom(48).hex()
    proxy.reference_values = _statement(live, 7, [SNP_MEASUREMENT.hex()])
    client = SealedOpenAI(base_url=f"{proxy.url}/v1", api_key=live.env.api_key, max_retries=0,
                          policy=_publisher_policy(live))
    assert ask(client).choices[0].message.content is not None
    proxy.reference_values = _statement(live, 6, [SNP_MEASUREMENT.hex(), withdrawn])
    client.sealed.forget(DEMO_MODEL)  # the pin is gone (expired, or the worker left): verified again
    proxy.seen.clear()
    with pytest.raises(StaleReferenceValues, match="serial 6"):
        ask(client)
    assert proxy.sealed_requests() == 0
    floored = SealedOpenAI(base_url=f"{proxy.url}/v1", api_key=live.env.api_key, max_retries=0,
                           policy=_publisher_policy(live, min_serial=7))
    with pytest.raises(StaleReferenceValues):
        ask(floored)
    assert proxy.sealed_requests() == 0 and not proxy.saw_canary()


def _same_version_other_digest(live: BindingsLive, genuine: dict) -> dict:
    """A worker of the same tenant, model and version, attested by the same (test) AMD hardware, whose
    evidence binds another package digest: a package the operator built under the version's name."""
    key, usage = WorkerKey.generate(), Ed25519PrivateKey.generate()
    usage_public = usage.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    bound = EvidenceBundle.from_json(genuine["evidence"])
    workload = dataclasses.replace(WorkloadClaims.decode(bound.runtime_data.workload), model_digest="ee" * 32)
    runtime = RuntimeData(nonce=os.urandom(32), hpke_public_key=key.public_bytes,
                          channel_binding=channel_binding(b"", usage_public), workload=workload.encode())
    report = live.env.platform.snp_report(expected_report_data(runtime, ()))
    bundle = EvidenceBundle(tee="snp", cpu_evidence=report, runtime_data=runtime,
                            cpu_certificates=bound.cpu_certificates)
    doc = {**genuine, "usage_public_key": usage_public.hex(), "grpc_tls_cert": None, "sealed_key_id": key.key_id,
           "model_digest": workload.model_digest}
    # Its statement names the tenant's genuine release policy (which admits the measurement), as the
    # genuine worker's does: the tenant pin passes, and the digest is what is refused.
    fields = {k: v for k, v in genuine["release"]["statement"].items() if k != "v"}
    doc["release"] = sign_release_statement(ReleaseStatement(**{**fields, "worker_key_id": key.key_id}),
                                            genuine["release"]["release_policy"], usage)
    remint(doc, bundle, live.env.home)
    return doc


def test_a_pin_is_not_reused_for_another_digest_of_the_version(live: BindingsLive, proxy: BindingsProxy) -> None:
    """The client verified (demo, model, v1, digest D). When it verifies again, the operator shows a
    worker whose genuine-format evidence says v1 with another digest: refused, nothing sent to it."""
    client = sealed_client(live)
    ask(client)
    pin = client.sealed.pinned(DEMO_MODEL)
    assert pin is not None

    def swap(doc: dict) -> None:
        doc["workers"] = [_same_version_other_digest(live, doc["workers"][0])]

    proxy.edit = swap
    client.sealed.forget(DEMO_MODEL)
    proxy.seen.clear()
    with pytest.raises(PinConflict, match=pin.model_digest):
        ask(client)
    assert proxy.sealed_requests() == 0 and not proxy.saw_canary()
