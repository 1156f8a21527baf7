"""The TEE-independent core: simulated TEE, evidence bundle binding, verifier, tokens, appraisal."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import os

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from attestation.appraisal import AppraisalPolicy, appraise
from attestation.bundle import EvidenceBundle, GpuEvidence, RuntimeData, check_binding, expected_report_data
from attestation.client import verify_worker_document
from attestation.errors import (
    AttestationError,
    FreshnessError,
    ParseError,
    PolicyViolation,
    SignatureError,
    TokenError,
    UnsupportedError,
)
from attestation.sim import SimTee, parse_sim_report, verify_sim_report, worker_measurement
from attestation.token import TokenIssuer, TokenVerifier
from attestation.verifier import VerifierTrust, verify_bundle
from attestation.workload import WorkloadClaims

NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
PLATFORM = Ed25519PrivateKey.generate()
MEASUREMENT = bytes(range(48))


def make_bundle(nonce: bytes | None = None, key: Ed25519PrivateKey = PLATFORM, gpus: tuple = (),
                workload: bytes = b"") -> EvidenceBundle:
    runtime = RuntimeData(nonce=nonce or os.urandom(32), hpke_public_key=os.urandom(32), workload=workload)
    report = SimTee(key, MEASUREMENT).get_report(expected_report_data(runtime, gpus))
    return EvidenceBundle(tee="sim", cpu_evidence=report, runtime_data=runtime, gpus=gpus)


def trust() -> VerifierTrust:
    return VerifierTrust(sim_platform_key=PLATFORM.public_key())


def test_sim_report_round_trip_and_measurement_depends_on_code_and_config() -> None:
    m1 = worker_measurement({"pkg/a.py": b"x = 1\n"}, {"model": "a"})
    assert m1 != worker_measurement({"pkg/a.py": b"x = 1\n"}, {"model": "b"})
    assert m1 != worker_measurement({"pkg/a.py": b"x = 2\n"}, {"model": "a"})
    assert m1 != worker_measurement({"pkg/b.py": b"x = 1\n"}, {"model": "a"})
    raw = SimTee(PLATFORM, m1).get_report(b"\x07" * 64)
    report = verify_sim_report(raw, PLATFORM.public_key())
    assert report.measurement == m1 and report.report_data == b"\x07" * 64 and not report.debug


def test_sim_report_signature_flip_rejected() -> None:
    raw = bytearray(SimTee(PLATFORM, MEASUREMENT).get_report(b"\x01" * 64))
    for offset in range(0, len(raw), 7):
        mutated = bytearray(raw)
        mutated[offset] ^= 0x01
        with pytest.raises(AttestationError):
            verify_sim_report(bytes(mutated), PLATFORM.public_key())


def test_sim_report_from_another_platform_key_rejected() -> None:
    raw = SimTee(Ed25519PrivateKey.generate(), MEASUREMENT).get_report(b"\x01" * 64)
    with pytest.raises(SignatureError):
        verify_sim_report(raw, PLATFORM.public_key())


@settings(max_examples=10_000, deadline=None)
@given(st.binary(max_size=600))
def test_fuzz_sim_parser_only_typed_errors(data: bytes) -> None:
    with contextlib.suppress(ParseError):
        parse_sim_report(data)


@settings(max_examples=10_000, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=12), c, max_size=5),
                    max_leaves=20))
def test_fuzz_bundle_parser_only_typed_errors(doc: object) -> None:
    with contextlib.suppress(ParseError):
        EvidenceBundle.from_json(doc)


def test_bundle_json_round_trip() -> None:
    gpu = GpuEvidence("hopper", b"\x11" * 40, b"-----BEGIN CERTIFICATE-----\n")
    bundle = make_bundle(gpus=(gpu,))
    again = EvidenceBundle.from_json(json.loads(json.dumps(bundle.to_json())))
    assert again == bundle and again.digest() == bundle.digest()


def test_verify_bundle_happy_path_is_insecure_sim() -> None:
    nonce = os.urandom(32)
    result = verify_bundle(make_bundle(nonce), expected_nonce=nonce, now=NOW, trust=trust())
    assert result.insecure and result.cpu.measurement == MEASUREMENT
    assert result.token_claims()["insecure"] is True


def _swap_runtime(bundle: EvidenceBundle, **changes: bytes) -> EvidenceBundle:
    runtime = RuntimeData(nonce=changes.get("nonce", bundle.runtime_data.nonce),
                          hpke_public_key=changes.get("key", bundle.runtime_data.hpke_public_key))
    return EvidenceBundle(bundle.tee, bundle.cpu_evidence, runtime, bundle.cpu_certificates, bundle.gpus)


NEGATIVE_BUNDLES = [
    ("other-nonce-than-issued", lambda b, n: (b, os.urandom(32)), FreshnessError),
    ("hpke-key-swapped", lambda b, n: (_swap_runtime(b, key=os.urandom(32)), n), FreshnessError),
    ("nonce-swapped-in-runtime", lambda b, n: (_swap_runtime(b, nonce=(m := os.urandom(32))), m), FreshnessError),
    ("gpu-evidence-added", lambda b, n: (EvidenceBundle(b.tee, b.cpu_evidence, b.runtime_data, (), (
        GpuEvidence("hopper", b"x", b""),)), n), AttestationError),
    ("unknown-tee", lambda b, n: (EvidenceBundle("sgx", b.cpu_evidence, b.runtime_data), n), UnsupportedError),
]


@pytest.mark.parametrize(("name", "mutate", "error"), NEGATIVE_BUNDLES, ids=[c[0] for c in NEGATIVE_BUNDLES])
def test_verify_bundle_negative(name: str, mutate, error: type[Exception]) -> None:  # type: ignore[no-untyped-def]
    nonce = os.urandom(32)
    bundle, expected = mutate(make_bundle(nonce), nonce)
    with pytest.raises(error):
        verify_bundle(bundle, expected_nonce=expected, now=NOW, trust=trust())


def test_sim_refused_where_verifier_has_no_sim_key() -> None:
    nonce = os.urandom(32)
    with pytest.raises(UnsupportedError):
        verify_bundle(make_bundle(nonce), expected_nonce=nonce, now=NOW, trust=VerifierTrust())


def test_binding_rejects_wrong_report_data() -> None:
    bundle = make_bundle()
    with pytest.raises(FreshnessError):
        check_binding(b"\x00" * 64, bundle)


def issuer() -> TokenIssuer:
    return TokenIssuer(ec.generate_private_key(ec.SECP256R1()), "sealed-key-broker")


def test_token_round_trip_and_jwks() -> None:
    iss = issuer()
    token = iss.issue({"tee": "sim", "measurement": "aa"}, NOW)
    claims = TokenVerifier(iss.jwks(), "sealed-key-broker").verify(token, NOW + dt.timedelta(seconds=10))
    assert claims["tee"] == "sim" and claims["exp"] > claims["iat"]


def _none_alg(token: str) -> str:
    _, body, _ = token.split(".")
    fake = base64.urlsafe_b64encode(json.dumps({"alg": "none", "typ": "JWT"}).encode()).rstrip(b"=").decode()
    return f"{fake}.{body}."


TOKEN_NEGATIVES = [
    ("expired", lambda t, i: (t, NOW + dt.timedelta(hours=1), i)),
    ("not-yet-valid", lambda t, i: (t, NOW - dt.timedelta(hours=1), i)),
    ("other-key", lambda t, i: (t, NOW, issuer())),
    ("alg-none", lambda t, i: (_none_alg(t), NOW, i)),
    ("tampered-body", lambda t, i: (t.split(".")[0] + "." + base64.urlsafe_b64encode(
        b'{"tee":"snp"}').rstrip(b"=").decode() + "." + t.split(".")[2], NOW, i)),
    ("garbage", lambda t, i: ("not.a.token", NOW, i)),
    ("hs256-with-public-key", lambda t, i: (jwt.encode({"iss": "sealed-key-broker"}, "secret",
                                                         algorithm="HS256"), NOW, i)),
]


@pytest.mark.parametrize(("name", "mutate"), TOKEN_NEGATIVES, ids=[c[0] for c in TOKEN_NEGATIVES])
def test_token_negative(name: str, mutate) -> None:  # type: ignore[no-untyped-def]
    iss = issuer()
    token, when, verifier_issuer = mutate(iss.issue({"tee": "sim"}, NOW), iss)
    with pytest.raises(TokenError):
        TokenVerifier(verifier_issuer.jwks(), "sealed-key-broker").verify(token, when)


def test_token_wrong_issuer_name() -> None:
    iss = issuer()
    with pytest.raises(TokenError):
        TokenVerifier(iss.jwks(), "someone-else").verify(iss.issue({}, NOW), NOW)


GOOD_CLAIMS = {"tee": "snp", "measurement": "ab" * 48, "tcb_status": "UpToDate", "tcb": {"snp": 8},
               "debug": False, "insecure": False, "gpus": [{"cc_enabled": True}]}
STRICT = AppraisalPolicy(allowed_tee=frozenset({"snp"}), allowed_measurements=frozenset({"AB" * 48}),
                         min_tcb={"snp": 8}, require_gpu_cc=True)


def test_appraisal_accepts_matching_claims() -> None:
    appraise(GOOD_CLAIMS, STRICT)


APPRAISAL_NEGATIVES = [
    ("tee", {"tee": "tdx"}, "TEE"),
    ("measurement", {"measurement": "cd" * 48}, "measurement"),
    ("tcb-status", {"tcb_status": "OutOfDate"}, "TCB status"),
    ("tcb-floor", {"tcb": {"snp": 7}}, "below"),
    ("debug", {"debug": True}, "debug"),
    ("gpu-cc", {"gpus": [{"cc_enabled": False}]}, "GPU"),
    ("no-gpu", {"gpus": []}, "GPU"),
    ("sim", {"tee": "sim", "insecure": True}, "simulated"),
]


@pytest.mark.parametrize(("name", "change", "needle"), APPRAISAL_NEGATIVES, ids=[c[0] for c in APPRAISAL_NEGATIVES])
def test_appraisal_negative(name: str, change: dict, needle: str) -> None:
    with pytest.raises(PolicyViolation) as err:
        appraise({**GOOD_CLAIMS, **change}, STRICT)
    assert any(needle in v for v in err.value.violations)


def test_appraisal_reports_every_violation_together() -> None:
    with pytest.raises(PolicyViolation) as err:
        appraise({**GOOD_CLAIMS, "debug": True, "measurement": "00", "tee": "tdx"}, STRICT)
    assert len(err.value.violations) >= 3


def test_default_policy_allows_nothing() -> None:
    with pytest.raises(PolicyViolation):
        appraise(GOOD_CLAIMS, AppraisalPolicy())


def test_unknown_policy_keys_rejected() -> None:
    with pytest.raises(PolicyViolation):
        AppraisalPolicy.from_dict({"allowed_tees": ["snp"]})


def _worker_doc(iss: TokenIssuer) -> tuple[dict, EvidenceBundle]:
    nonce = os.urandom(32)
    bundle = make_bundle(nonce, workload=WorkloadClaims("acme", "m", "v1", "d").encode())
    result = verify_bundle(bundle, expected_nonce=nonce, now=NOW, trust=trust())
    claims = {**result.token_claims(), "sealed": {"tenant": "acme", "model": "m", "version": "v1"}}
    return {"model": "m", "version": "v1", "evidence": bundle.to_json(), "token": iss.issue(claims, NOW)}, bundle


def test_client_pins_worker_key_only_under_a_policy_allowing_sim() -> None:
    iss = issuer()
    doc, bundle = _worker_doc(iss)
    verifier = TokenVerifier(iss.jwks(), "sealed-key-broker")
    sim_ok = AppraisalPolicy(allowed_tee=frozenset({"sim"}), allowed_measurements=frozenset({MEASUREMENT.hex()}),
                             unsafe_allow_simulated_tee=True)
    pinned = verify_worker_document(doc, verifier, sim_ok, NOW, evidence_trust=trust())
    assert pinned.hpke_public_key == bundle.runtime_data.hpke_public_key and pinned.insecure
    assert pinned.workload.tenant == "acme"
    with pytest.raises(PolicyViolation):
        verify_worker_document(doc, verifier, AppraisalPolicy(allowed_tee=frozenset({"sim"}),
                               allowed_measurements=frozenset({MEASUREMENT.hex()})), NOW, evidence_trust=trust())


def test_client_rejects_evidence_swapped_under_a_valid_token() -> None:
    iss = issuer()
    doc, _ = _worker_doc(iss)
    other, _ = _worker_doc(iss)
    doc["evidence"] = other["evidence"]
    with pytest.raises(FreshnessError):
        verify_worker_document(doc, TokenVerifier(iss.jwks(), "sealed-key-broker"), AppraisalPolicy(
            allowed_tee=frozenset({"sim"}), allowed_measurements=frozenset({MEASUREMENT.hex()}),
            unsafe_allow_simulated_tee=True), NOW, evidence_trust=trust())
