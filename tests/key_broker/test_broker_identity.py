"""The key broker as a confidential workload: its keys are made inside it and kept only sealed to its
measurement; its identity document is bound by its evidence (POST /v1/broker/attestation), and the
relying parties' check of that evidence refuses every mismatch (a negative table)."""

from __future__ import annotations

import base64
import copy
import json
import secrets
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from attestation.broker_identity import verify_broker_attestation
from attestation.bundle import EvidenceBundle, expected_report_data
from attestation.errors import AttestationError, BrokerIdentityError, FreshnessError, ParseError, SignatureError
from attestation.verifier import VerifierTrust
from key_broker.errors import SealedStateError
from key_broker.sealed_keys import SEALED_KEYS_FILE
from protocol.broker.identity import BrokerIdentity, broker_runtime_data
from tests.key_broker.conftest import Clock, Harness, sim_report


def _raw(key: Any) -> bytes:
    return key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())


def _trust(kb: Harness) -> VerifierTrust:
    platform = serialization.load_pem_private_key(kb.broker_platform.read_bytes(), None)
    return VerifierTrust(sim_platform_key=platform.public_key())  # type: ignore[union-attr,arg-type]


def _measurement(kb: Harness) -> str:
    assert kb.service.attested is not None
    return kb.service.attested.platform.measurement.hex()


def _answer(kb: Harness, nonce: bytes) -> dict[str, Any]:
    r = kb.client.post("/v1/broker/attestation", json={"nonce": nonce.hex()})
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_the_broker_attests_its_identity_and_a_relying_party_verifies_it(kb: Harness) -> None:
    nonce = secrets.token_bytes(32)
    verified = verify_broker_attestation(_answer(kb, nonce), nonce=nonce, now=kb.clock(), trust=_trust(kb),
                                         allowed_measurements=[_measurement(kb)])
    identity = verified.identity
    assert identity.token_jwks == kb.client.get("/.well-known/jwks.json").json()
    receipt_pem = kb.client.get("/v1/receipts/public-key").json()["public_key_pem"].encode()
    assert verified.receipt_key.public_bytes(serialization.Encoding.PEM,
                                             serialization.PublicFormat.SubjectPublicKeyInfo) == receipt_pem
    assert identity.measured_config["role"] == "key-broker" and identity.tee == "sim"
    assert verified.cpu.report_data == expected_report_data(broker_runtime_data(identity, nonce), ())


def _tamper_evidence_byte(answer: dict[str, Any]) -> None:
    raw = bytearray(base64.b64decode(answer["evidence"]["cpu_evidence"]))
    raw[-1] ^= 1  # the signature's last byte
    answer["evidence"]["cpu_evidence"] = base64.b64encode(bytes(raw)).decode()


def _swap_receipt_key(answer: dict[str, Any]) -> None:
    # An impersonator's own receipt key in the document: the hardware-bound digest no longer matches.
    answer["identity"]["receipt_key"] = Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def _swap_jwks(answer: dict[str, Any]) -> None:
    answer["identity"]["token_jwks"]["keys"][0]["x"] = base64.urlsafe_b64encode(bytes(32)).decode().rstrip("=")


def _rebind(answer: dict[str, Any]) -> None:
    # A document of its own AND runtime data recomputed for it: the signed REPORT_DATA still binds the old one.
    _swap_receipt_key(answer)
    identity = BrokerIdentity.from_json(answer["identity"])
    rd = broker_runtime_data(identity, bytes.fromhex(answer["evidence"]["runtime_data"]["nonce"]))
    answer["evidence"]["runtime_data"]["channel_binding"] = rd.channel_binding.hex()


def _drop_field(answer: dict[str, Any]) -> None:
    del answer["identity"]["import_key"]


TAMPERS = {
    "evidence-byte-flipped": (_tamper_evidence_byte, SignatureError),
    "identity-receipt-key-swapped": (_swap_receipt_key, FreshnessError),
    "identity-token-key-swapped": (_swap_jwks, FreshnessError),
    "identity-and-runtime-data-swapped": (_rebind, FreshnessError),
    "identity-malformed": (_drop_field, ParseError),
}


@pytest.mark.parametrize("case", sorted(TAMPERS))
def test_a_tampered_answer_is_refused(kb: Harness, case: str) -> None:
    tamper, error = TAMPERS[case]
    nonce = secrets.token_bytes(32)
    answer = copy.deepcopy(_answer(kb, nonce))
    tamper(answer)
    with pytest.raises(error):
        verify_broker_attestation(answer, nonce=nonce, now=kb.clock(), trust=_trust(kb),
                                  allowed_measurements=[_measurement(kb)])


def test_another_nonce_measurement_platform_or_no_pin_is_refused(kb: Harness) -> None:
    nonce = secrets.token_bytes(32)
    answer = _answer(kb, nonce)
    ok = {"nonce": nonce, "now": kb.clock(), "trust": _trust(kb), "allowed_measurements": [_measurement(kb)]}
    cases: list[tuple[dict[str, Any], type[Exception]]] = [
        ({"nonce": secrets.token_bytes(32)}, FreshnessError),  # a replayed answer
        ({"allowed_measurements": [bytes(48).hex()]}, BrokerIdentityError),  # another broker build
        ({"allowed_measurements": []}, BrokerIdentityError),  # nothing pinned: never "any broker"
        ({"trust": VerifierTrust()}, AttestationError),  # a verifier that does not accept the simulated TEE
        ({"trust": VerifierTrust(sim_platform_key=Ed25519PrivateKey.generate().public_key())}, SignatureError),
    ]
    for change, error in cases:
        with pytest.raises(error):
            verify_broker_attestation(answer, **{**ok, **change})


def test_a_debug_broker_and_a_tee_the_document_does_not_name_are_refused(kb: Harness) -> None:
    nonce = secrets.token_bytes(32)
    answer = _answer(kb, nonce)
    identity = BrokerIdentity.from_json(answer["identity"])
    platform = serialization.load_pem_private_key(kb.broker_platform.read_bytes(), None)
    runtime = broker_runtime_data(identity, nonce)
    report = sim_report(platform, bytes.fromhex(_measurement(kb)), expected_report_data(runtime, ()),  # type: ignore[arg-type]
                        debug=True)
    debug = {**answer, "evidence": EvidenceBundle("sim", report, runtime).to_json()}
    with pytest.raises(BrokerIdentityError, match="debug"):
        verify_broker_attestation(debug, nonce=nonce, now=kb.clock(), trust=_trust(kb),
                                  allowed_measurements=[_measurement(kb)])
    other = {**answer, "identity": {**answer["identity"], "tee": "snp"}}
    with pytest.raises(FreshnessError):  # the document's digest is bound: any edit is caught first
        verify_broker_attestation(other, nonce=nonce, now=kb.clock(), trust=_trust(kb),
                                  allowed_measurements=[_measurement(kb)])


def test_a_malformed_nonce_is_a_422(kb: Harness) -> None:
    for body in ({"nonce": "ab"}, {"nonce": "zz" * 32}, {}):
        assert kb.client.post("/v1/broker/attestation", json=body).status_code == 422


# --- the broker's keys at rest -------------------------------------------------------------------


def _key_needles(kb: Harness) -> list[bytes]:
    scalar = kb.service.issuer.signing_key.private_numbers().private_value.to_bytes(32, "big")  # ES256
    needles = [scalar, _raw(kb.service.receipts._key), _raw(kb.service.import_key)]
    return [n for raw in needles for n in (raw, raw.hex().encode(), base64.b64encode(raw))]


def test_no_private_key_of_the_broker_is_on_its_disk_in_plaintext(kb: Harness) -> None:
    kb.setup_tenant("acme")
    kb.obtain("acme")
    files = [p for p in kb.settings.data_dir.rglob("*") if p.is_file()]
    assert (kb.settings.data_dir / SEALED_KEYS_FILE) in files
    assert not [p for p in files if b"PRIVATE KEY" in p.read_bytes()]
    for needle in _key_needles(kb):
        for path in files:
            assert needle not in path.read_bytes(), f"a broker private key in plaintext in {path}"


def test_keys_survive_a_restart_but_not_another_measurement_or_platform(tmp_path: Path) -> None:
    clock = Clock()
    first = Harness(tmp_path / "kb", clock)
    jwks = first.client.get("/.well-known/jwks.json").json()
    first.close()
    again = Harness(tmp_path / "kb", clock)
    assert again.client.get("/.well-known/jwks.json").json() == jwks  # unsealed, not regenerated
    again.close()
    with pytest.raises(SealedStateError, match="another workload"):  # another build of the broker
        Harness(tmp_path / "kb", clock, unsafe_sim_measurement=bytes(range(1, 49)).hex())
    resealed = Harness(tmp_path / "kb", clock, unsafe_sim_measurement=bytes(range(1, 49)).hex(),
                       unsafe_sim_reseal=True)
    assert resealed.client.get("/.well-known/jwks.json").json() == jwks
    resealed.close()
    (tmp_path / "kb" / "broker-platform.pem").write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    with pytest.raises(SealedStateError, match="does not open"):  # another platform
        Harness(tmp_path / "kb", clock, unsafe_sim_measurement=bytes(range(1, 49)).hex())


@pytest.mark.parametrize("name", ["master.key", "token-signing.pem", "receipt-signing.pem", "import-x25519.pem"])
def test_plaintext_key_files_of_an_older_broker_are_refused(tmp_path: Path, name: str) -> None:
    (tmp_path / "kb" / "broker").mkdir(parents=True)
    (tmp_path / "kb" / "broker" / name).write_text("old")
    with pytest.raises(SealedStateError, match="plaintext key files"):
        Harness(tmp_path / "kb", Clock())


def test_an_edited_sealed_file_is_refused(tmp_path: Path) -> None:
    Harness(tmp_path / "kb", Clock()).close()
    path = tmp_path / "kb" / "broker" / SEALED_KEYS_FILE
    doc = json.loads(path.read_bytes())
    ct = bytearray(base64.b64decode(doc["ciphertext"]))
    ct[0] ^= 1
    path.write_text(json.dumps({**doc, "ciphertext": base64.b64encode(bytes(ct)).decode()}))
    with pytest.raises(SealedStateError):
        Harness(tmp_path / "kb", Clock())


def test_the_attestation_is_fresh_each_time(kb: Harness) -> None:
    a, b = secrets.token_bytes(32), secrets.token_bytes(32)
    assert _answer(kb, a)["evidence"] != _answer(kb, b)["evidence"]
