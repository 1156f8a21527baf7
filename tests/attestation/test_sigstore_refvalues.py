"""Reference values as a Sigstore bundle: a real public bundle (sigstore-python's staging DSSE bundle,
tests/vectors/sigstore) verified offline against a pinned trusted root and a pinned identity."""

from __future__ import annotations

import base64
import copy
import datetime as dt
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from attestation.refvalues import NotReferenceValues, ReferenceValuesError, StaleReferenceValues, read_statement
from attestation.sigstore_refvalues import (
    PRODUCTION_TRUSTED_ROOT,
    SigstoreBundleError,
    SigstorePublisher,
    is_sigstore_bundle,
    verify_sigstore_bundle,
    verify_sigstore_reference_values,
)

VECTORS = Path(__file__).resolve().parents[1] / "vectors" / "sigstore"
BUNDLE = VECTORS / "a.dsse.staging-rekor-v2.txt.sigstore.json"
# Who signed the real bundle: the sigstore-conformance beacon workflow, through GitHub Actions' OIDC.
IDENTITY = ("https://github.com/sigstore-conformance/extremely-dangerous-public-oidc-beacon/.github/workflows/"
            "extremely-dangerous-oidc-beacon.yml@refs/heads/main")
ISSUER = "https://token.actions.githubusercontent.com"
PUBLISHER = SigstorePublisher(IDENTITY, ISSUER, VECTORS / "staging.trusted_root.json")
NOW = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Verification is offline: any attempt to open a connection (TUF, Rekor, OCSP) fails the test."""
    def refuse(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("Sigstore verification tried to reach the network")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def _bundle() -> dict[str, Any]:
    return json.loads(BUNDLE.read_text())


def test_the_real_public_bundle_verifies_offline_for_its_pinned_identity() -> None:
    doc = _bundle()
    assert is_sigstore_bundle(doc)
    payload_type, body = verify_sigstore_bundle(doc, PUBLISHER)
    assert payload_type == "application/vnd.in-toto+json"
    assert json.loads(body)["subject"][0]["name"] == "a.txt"


def _tamper_payload(doc: dict[str, Any]) -> None:
    statement = json.loads(base64.b64decode(doc["dsseEnvelope"]["payload"]))
    statement["subject"][0]["digest"]["sha256"] = "00" * 32
    doc["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()


def _tamper_signature(doc: dict[str, Any]) -> None:
    sig = bytearray(base64.b64decode(doc["dsseEnvelope"]["signatures"][0]["sig"]))
    sig[-1] ^= 1
    doc["dsseEnvelope"]["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()


def _tamper_inclusion_proof(doc: dict[str, Any]) -> None:
    proof = doc["verificationMaterial"]["tlogEntries"][0]["inclusionProof"]
    proof["hashes"][0] = base64.b64encode(b"\0" * 32).decode()


def _tamper_checkpoint(doc: dict[str, Any]) -> None:
    proof = doc["verificationMaterial"]["tlogEntries"][0]["inclusionProof"]
    proof["checkpoint"]["envelope"] = proof["checkpoint"]["envelope"].replace("4026479", "4026480", 1)


def _drop_timestamps(doc: dict[str, Any]) -> None:
    doc["verificationMaterial"].pop("timestampVerificationData")


def _swap_certificate(doc: dict[str, Any]) -> None:
    cert = bytearray(base64.b64decode(doc["verificationMaterial"]["certificate"]["rawBytes"]))
    cert[-5] ^= 1  # inside the CA's signature over the certificate
    doc["verificationMaterial"]["certificate"]["rawBytes"] = base64.b64encode(bytes(cert)).decode()


TAMPERED = {
    "payload changed": _tamper_payload,
    "DSSE signature changed": _tamper_signature,
    "Rekor inclusion proof changed": _tamper_inclusion_proof,
    "Rekor checkpoint changed": _tamper_checkpoint,
    "signed timestamps removed": _drop_timestamps,
    "certificate signature changed": _swap_certificate,
}


@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_a_tampered_bundle_is_refused(case: str) -> None:
    doc = copy.deepcopy(_bundle())
    TAMPERED[case](doc)
    with pytest.raises(SigstoreBundleError):
        verify_sigstore_bundle(doc, PUBLISHER)


@pytest.mark.parametrize("publisher", [
    SigstorePublisher("https://github.com/someone-else/repo/.github/workflows/release.yml@refs/heads/main",
                      ISSUER, PUBLISHER.trusted_root),
    SigstorePublisher(IDENTITY, "https://accounts.google.com", PUBLISHER.trusted_root),
    SigstorePublisher(IDENTITY, ISSUER, PRODUCTION_TRUSTED_ROOT),  # the public-good root: not staging's CA/log
], ids=["other identity", "other issuer", "other trusted root"])
def test_the_pinned_identity_and_root_decide(publisher: SigstorePublisher) -> None:
    with pytest.raises(SigstoreBundleError):
        verify_sigstore_bundle(_bundle(), publisher)


def test_what_is_not_a_bundle_is_refused() -> None:
    envelope = _bundle()["dsseEnvelope"]  # the bare envelope, without certificate or log entry
    with pytest.raises(SigstoreBundleError):
        verify_sigstore_bundle(envelope, PUBLISHER)
    with pytest.raises(SigstoreBundleError):
        verify_sigstore_bundle(_bundle(), SigstorePublisher(IDENTITY, ISSUER, VECTORS / "missing.json"))


def test_a_real_bundle_with_a_foreign_predicate_is_not_reference_values() -> None:
    """The bundle verifies (right identity, right root) but signs SLSA provenance, not measurements:
    the reference-value reader refuses it with its own type, so a publisher's signature over anything
    else never widens the set of allowed measurements."""
    with pytest.raises(NotReferenceValues, match=r"slsa\.dev/provenance"):
        verify_sigstore_reference_values(_bundle(), PUBLISHER, NOW)


def test_the_statement_reader_is_the_one_the_pinned_key_path_uses() -> None:
    """What a verified bundle hands over goes through `read_statement`, like a pinned-key envelope."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from attestation.refvalues import sign_reference_values

    envelope = sign_reference_values(Ed25519PrivateKey.generate(), ["ab" * 48], tee="snp", issued_at=NOW,
                                     valid_for=dt.timedelta(days=1), serial=9)
    body = base64.b64decode(envelope["payload"])
    values = read_statement(envelope["payloadType"], body, NOW, signer=PUBLISHER.describe())
    assert values.measurements == {"ab" * 48} and values.signer.startswith("sigstore https://github.com/")
    assert values.serial == 9 and read_statement(envelope["payloadType"], body, NOW, "x", min_serial=9).serial == 9
    with pytest.raises(StaleReferenceValues, match="serial 9"):  # the Sigstore path passes its floor here too
        read_statement(envelope["payloadType"], body, NOW, signer="x", min_serial=10)
    with pytest.raises(ReferenceValuesError, match="expired"):
        read_statement(envelope["payloadType"], body, NOW + dt.timedelta(days=2), signer="x")
    with pytest.raises(NotReferenceValues):
        read_statement("text/plain", body, NOW, signer="x")


def test_a_publisher_policy_names_identity_issuer_and_root() -> None:
    pinned = SigstorePublisher.from_dict({"identity": IDENTITY, "issuer": ISSUER}, base=VECTORS)
    assert pinned.trusted_root == PRODUCTION_TRUSTED_ROOT
    relative = SigstorePublisher.from_dict({"identity": IDENTITY, "issuer": ISSUER,
                                            "trusted_root": "staging.trusted_root.json"}, base=VECTORS)
    assert relative == PUBLISHER
    with pytest.raises(ValueError):
        SigstorePublisher.from_dict({"identity": IDENTITY})
    with pytest.raises(ValueError):
        SigstorePublisher.from_dict({"identity": IDENTITY, "issuer": ISSUER, "digest": "ab"})
