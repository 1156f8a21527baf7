"""A real broker process on localhost: a restart loses no keys, policies, receipts or admin tokens;
an in-flight session fails cleanly; used tokens stay used; no secret reaches a log or error body."""

from __future__ import annotations

import base64
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from attestation.bundle import EvidenceBundle, RuntimeData, expected_report_data
from attestation.sim import SimTee
from key_broker.router import REFUSED
from policy.release_documents import invitation_acceptance, sign_release_policy
from protocol.broker.client import obtain_data_key
from protocol.broker.sealing import raw_public_key
from protocol.model_ref import ModelRef
from protocol.package.signing import signer_identity

MEASUREMENT = bytes(range(48))
SIGNER = signer_identity(Ed25519PrivateKey.from_private_bytes(bytes(range(32))).public_key())  # as conftest


class BrokerProcess:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.platform = Ed25519PrivateKey.generate()
        self.pub = root / "sim.pub.pem"
        root.mkdir(parents=True, exist_ok=True)
        self.pub.write_bytes(
            self.platform.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        self.broker_platform = root / "broker-platform.pem"  # the broker's own simulated TEE
        self.broker_platform.write_bytes(Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        self.admin_token = secrets.token_urlsafe(32)
        with socket_port() as port:
            self.url = f"http://127.0.0.1:{port}"
            self.port = port
        self.proc: subprocess.Popen | None = None
        self.extra_args: list[str] = []
        self.tenant_tokens: dict[str, str] = {}
        self.policy_keys: dict[str, Ed25519PrivateKey] = {}

    def start(self) -> None:
        env = {**os.environ, "SEALED_BROKER_ADMIN_TOKEN": self.admin_token, "PYTHONUNBUFFERED": "1"}
        log = open(self.root / "broker.log", "ab")  # noqa: SIM115 (owned by the child)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "key_broker",
                "--data-dir",
                str(self.root / "broker"),
                "--port",
                str(self.port),
                "--sim-platform-key",
                str(self.pub),
                "--sim-platform-signing-key",
                str(self.broker_platform),
                *self.extra_args,
                # A fresh broker is initialised explicitly; a restart is not (#46).
                *([] if (self.root / "broker" / "broker-keys.sealed").exists() else ["--init"]),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.root / "broker.log").read_text()[-2000:]
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise TimeoutError("broker did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def admin(self, method: str, path: str, token: str | None = None, **kw: Any) -> httpx.Response:
        return httpx.request(
            method,
            f"{self.url}/v1/admin{path}",
            timeout=10,
            headers={"Authorization": f"Bearer {token or self.admin_token}"},
            **kw,
        )

    def tenant_token(self, tenant: str) -> str:
        """The tenant's own tenant-admin token (issued once by the operator)."""
        if tenant not in self.tenant_tokens:
            self.tenant_tokens[tenant] = self.admin("POST", f"/tenants/{tenant}/admin-tokens").json()["token"]
        return self.tenant_tokens[tenant]

    def put_signed_policy(self, tenant: str, doc: dict[str, Any]) -> httpx.Response:
        """``doc`` signed by the tenant's policy-admin key (registered with its own token on first use)."""
        if tenant not in self.policy_keys:
            key = Ed25519PrivateKey.generate()
            invitation = self.admin("POST", f"/tenants/{tenant}/invitations").json()
            statement = invitation_acceptance(tenant, key, "k1", invitation["payload"])
            r = self.admin("PUT", f"/tenants/{tenant}/policy-admin-key", token=self.tenant_token(tenant),
                           json=statement)
            assert r.status_code == 200, r.text
            self.policy_keys[tenant] = key
        return self.admin("PUT", f"/tenants/{tenant}/policies",
                          json=sign_release_policy(doc, self.policy_keys[tenant], "k1"))

    def make_bundle(self, runtime: RuntimeData) -> EvidenceBundle:
        report = SimTee(self.platform, MEASUREMENT).get_report(expected_report_data(runtime, ()))
        return EvidenceBundle(tee="sim", cpu_evidence=report, runtime_data=runtime)


class socket_port:
    def __enter__(self) -> int:
        import socket

        self._s = socket.socket()
        self._s.bind(("127.0.0.1", 0))
        return int(self._s.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self._s.close()


@pytest.fixture()
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path)
    proc.start()
    yield proc
    proc.stop()


def _import_pem(broker: BrokerProcess) -> str:
    return httpx.get(f"{broker.url}/v1/import-key", timeout=10).json()["public_key_pem"]


def test_restart_loses_nothing_and_in_flight_sessions_fail_cleanly(broker: BrokerProcess, sealed_upload) -> None:  # type: ignore[no-untyped-def]
    body, data_key = sealed_upload(_import_pem(broker), "acme", "m", "v1")
    assert broker.admin("POST", "/tenants/acme/key").status_code == 201
    assert broker.admin("PUT", "/tenants/acme/models/m/versions/v1/data-key", json=body,
                        token=broker.tenant_token("acme")).status_code == 201
    assert (
        broker.put_signed_policy(
            "acme",
            {
                "policy_id": "acme-m",
                "version": 1,
                "tenant": "acme",
                "model": "m",
                "allowed_tee": ["sim"],
                "allowed_measurements": [MEASUREMENT.hex()],
                "required_signer": SIGNER,
                "unsafe_allow_simulated_tee": True,
            },
        ).status_code
        == 200
    )
    tenant_token = broker.tenant_token("acme")
    with httpx.Client(base_url=broker.url, timeout=10) as client:
        first = obtain_data_key(client, ModelRef("acme", "m", "v1"), make_bundle=broker.make_bundle)
        assert first.data_key == data_key
        in_flight = client.post("/v1/challenge").json()

    broker.stop()
    broker.start()

    with httpx.Client(base_url=broker.url, timeout=10) as client:
        # The open session died with the old process: one clean, opaque refusal.
        runtime = RuntimeData(bytes.fromhex(in_flight["nonce"]), raw_public_key(X25519PrivateKey.generate()))
        r = client.post(
            "/v1/attest",
            json={
                "session_id": in_flight["session_id"],
                "tenant": "acme",
                "model": "m",
                "version": "v1",
                "evidence": broker.make_bundle(runtime).to_json(),
            },
        )
        assert r.status_code == 403 and r.json() == REFUSED
        # A token used before the restart stays used.
        replay = client.post("/v1/key", json={"token": first.token, "tenant": "acme", "model": "m", "version": "v1"})
        assert replay.status_code == 403
        # Keys, policy and tenant-admin token survived; a new round trip works.
        second = obtain_data_key(client, ModelRef("acme", "m", "v1"), make_bundle=broker.make_bundle)
        assert second.data_key == data_key
    receipts = broker.admin("GET", "/tenants/acme/receipts", token=tenant_token).json()["receipts"]
    assert [line["receipt"]["token_id"] for line in receipts] == [first.token_id, second.token_id]
    assert broker.admin("GET", "/tenants/acme/policies", token=tenant_token).json()[0]["version"] == 1

    # Error bodies never echo secrets: a bad upload carrying a key is refused without quoting it.
    leaked = secrets.token_bytes(32)
    bad = broker.admin(
        "PUT",
        "/tenants/acme/models/m/versions/v9/data-key",
        token=tenant_token,
        json={"data_key": base64.b64encode(leaked).decode(), "key_id": "k" * 500, "model_digest": "zz"},  # old shape
    )
    assert bad.status_code == 422
    broker.stop()
    secrets_to_find = [
        data_key.hex(),
        base64.b64encode(data_key).decode(),
        leaked.hex(),
        base64.b64encode(leaked).decode(),
        broker.admin_token,
        tenant_token,
    ]
    assert not any(s in bad.text for s in secrets_to_find)
    scanned = 0
    for path in broker.root.rglob("*"):
        if path.is_file() and path.suffix in (".log", ".jsonl", ".json"):
            text = path.read_text(errors="replace")
            scanned += 1
            for needle in secrets_to_find:
                assert needle not in text, f"secret material in {path}"
    assert scanned >= 5
    for path in (broker.root / "broker").rglob("*"):
        if path.is_file() and path.suffix in (".json", ".key", ".pem") and "jwks" not in path.name:
            assert path.stat().st_mode & 0o077 == 0, f"{path} is readable by others"


def _broker_policy(broker: BrokerProcess, tmp_path: Path) -> Path:
    """What the tenant trusts: this broker build's simulated measurement and platform key."""
    from key_broker.measurement import simulated_measurement
    from key_broker.settings import BrokerSettings

    settings = BrokerSettings(data_dir=broker.root / "broker", sim_platform_public_key=broker.pub,
                              sim_platform_signing_key=broker.broker_platform)
    key = serialization.load_pem_private_key(broker.broker_platform.read_bytes(), None)
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)  # type: ignore[union-attr]
    path = tmp_path / "broker-policy.json"
    path.write_text(json.dumps({"evidence": {"sim_platform_key": raw.hex()},
                                "appraisal": {"unsafe_allow_simulated_tee": True},
                                "broker": {"tee": "sim", "measurements": [simulated_measurement(settings).hex()]}}))
    return path


def test_cli_manages_tenant_keys_through_the_admin_api(
    broker: BrokerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sealed_upload: Any
) -> None:
    from typer.testing import CliRunner

    from api.cli.keys import build

    cli, runner = build(), CliRunner()
    monkeypatch.setenv("SEALED_ADMIN_TOKEN", broker.admin_token)
    url = ["--url", broker.url]
    invitation = tmp_path / "invitation.json"
    assert runner.invoke(cli, ["create", "--tenant", "acme", "--invitation-out", str(invitation), *url]).exit_code == 0
    policy = tmp_path / "policy.json"
    policy.write_text(
        '{"policy_id": "p", "version": 1, "tenant": "acme", "model": "m", "allowed_tee": ["sim"],'
        f' "allowed_measurements": ["{MEASUREMENT.hex()}"], "unsafe_allow_simulated_tee": true}}'
    )
    admin_key = tmp_path / "acme-admin.pem"
    admin_key.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    signing = ["--admin-key", str(admin_key), "--home", str(tmp_path / "home")]
    # The operator's token can neither register the tenant's policy-admin key nor write its policy.
    assert runner.invoke(cli, ["admin-key", "--tenant", "acme", *signing, *url]).exit_code == 1
    assert runner.invoke(cli, ["policy", "--tenant", "acme", "--file", str(policy), *signing, *url]).exit_code != 0
    monkeypatch.setenv("SEALED_ADMIN_TOKEN", broker.tenant_token("acme"))  # the tenant's own token
    # Without the invitation there is nothing to bind (no trust on first use), and nothing is pinned.
    assert runner.invoke(cli, ["admin-key", "--tenant", "acme", *signing, *url]).exit_code == 1
    registered = runner.invoke(cli, ["admin-key", "--tenant", "acme", "--invitation", str(invitation),
                                     "--broker-policy", str(_broker_policy(broker, tmp_path)), *signing, *url])
    assert registered.exit_code == 0 and "acme-admin" in registered.output, registered.output
    assert runner.invoke(cli, ["policy", "--tenant", "acme", "--file", str(policy), *signing, *url]).exit_code == 0
    body, _ = sealed_upload(_import_pem(broker), "acme", "m", "v1")
    assert broker.admin("PUT", "/tenants/acme/models/m/versions/v1/data-key", json=body).status_code == 403
    assert broker.admin("PUT", "/tenants/acme/models/m/versions/v1/data-key", json=body,
                        token=broker.tenant_token("acme")).status_code == 201
    monkeypatch.setenv("SEALED_ADMIN_TOKEN", broker.admin_token)
    with httpx.Client(base_url=broker.url, timeout=10) as client:
        obtain_data_key(client, ModelRef("acme", "m", "v1"), make_bundle=broker.make_bundle)
    rotated = runner.invoke(cli, ["rotate", "--tenant", "acme", *url])
    assert rotated.exit_code == 0 and '"rewrapped": 1' in rotated.output
    out = tmp_path / "r.jsonl"
    listed = runner.invoke(cli, ["releases", "--tenant", "acme", "--out", str(out), *url])
    assert listed.exit_code == 0 and "policy=p v1" in listed.output
    verified = runner.invoke(
        cli,
        [
            "receipts",
            "--tenant",
            "acme",
            "--file",
            str(out),
            "--broker-key",
            str(out.with_suffix(".broker.pem")),
            "--verify",
        ],
    )
    assert verified.exit_code == 0 and "1 receipts verified" in verified.output
    assert runner.invoke(cli, ["revoke", "--tenant", "acme", *url]).exit_code != 0  # needs --yes
    assert runner.invoke(cli, ["revoke", "--tenant", "acme", "--yes", *url]).exit_code == 0
    status = runner.invoke(cli, ["status", "--tenant", "acme", *url])
    assert '"revoked": true' in status.output
    monkeypatch.setenv("SEALED_ADMIN_TOKEN", "wrong-" + secrets.token_hex(16))
    denied = runner.invoke(cli, ["status", "--tenant", "acme", *url])
    assert denied.exit_code == 1 and "401" in denied.output


def test_body_limit_holds_on_the_real_server(broker: BrokerProcess) -> None:
    big = b"{" + b" " * (1 << 20) + b"}"
    assert httpx.post(f"{broker.url}/v1/attest", content=big, timeout=10).status_code == 413

    def chunks():  # type: ignore[no-untyped-def]
        for _ in range(40):
            yield b" " * 32768

    r = httpx.post(
        f"{broker.url}/v1/attest", content=chunks(), timeout=10, headers={"content-type": "application/json"}
    )
    assert r.status_code == 413 and r.json()["error"]["message"] == "body too large"
    assert httpx.get(f"{broker.url}/healthz", timeout=5).status_code == 200  # the server is fine afterwards
