"""NVIDIA collateral imported offline (issue #33): OCSP answers checked at use, RIMs one per version,
the verifier appraising GPUs with them, and the client policy's RIM/OCSP/RTMR terms."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509 import ocsp

from attestation.appraisal import AppraisalPolicy, appraise
from attestation.bundle import EvidenceBundle, GpuEvidence, RuntimeData, expected_report_data
from attestation.collateral import CollateralConfig, CollateralStore
from attestation.errors import CollateralError, ParseError, PolicyViolation
from attestation.ocsp import OcspStatus
from attestation.ocsp_imported import ImportedOcspChecker
from attestation.tdx.eventlog import parse_cc_event_log, replay_rtmrs
from attestation.verifier import VerifierTrust, verify_bundle
from sealed_fakes import nvgpu_pki as gpu_pki
from sealed_fakes.ccel import kernel_cmdline, with_kernel_cmdline
from sealed_fakes.gpu_collateral import DRIVER, ocsp_answer, tampered_measurements
from sealed_fakes.platform import FakePlatform, gpu_report

NOW = dt.datetime.now(dt.UTC)
HOUR = dt.timedelta(hours=1)
CCEL = (Path(__file__).resolve().parents[1] / "vectors" / "tdx-ccel" / "ccel_data.dat").read_bytes()


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> FakePlatform:
    p = FakePlatform.create(tmp_path_factory.mktemp("gpu-collateral") / "platform", gpus=2, now=NOW)
    p.write_collateral(NOW, revoked_gpus={1})
    return p


def _answer(p: FakePlatform, *, revoked: bool = False, this: dt.datetime = NOW - HOUR,
            until: dt.datetime = NOW + HOUR) -> bytes:
    leaf, issuer = p.gpus[0].chain[0], p.gpus[0].chain[1]
    return ocsp_answer(leaf, issuer, p.gpus[0].chain_keys[1], revoked=revoked, this_update=this, next_update=until)


def _status(p: FakePlatform, *answers: bytes) -> OcspStatus:
    return ImportedOcspChecker.of(answers).status(p.gpus[0].chain[0], p.gpus[0].chain[1], NOW)


def test_imported_ocsp_answers_are_checked_at_use(platform: FakePlatform) -> None:
    assert _status(platform, _answer(platform)) is OcspStatus.GOOD
    assert _status(platform, _answer(platform, revoked=True)) is OcspStatus.REVOKED
    assert _status(platform) is OcspStatus.UNKNOWN  # no answer for this certificate
    # Another certificate's answer says nothing about this one.
    other = ocsp_answer(platform.gpus[1].chain[0], platform.gpus[1].chain[1], platform.gpus[1].chain_keys[1],
                        revoked=True, this_update=NOW - HOUR, next_update=NOW + HOUR)
    assert _status(platform, other) is OcspStatus.UNKNOWN
    # A "good" past its nextUpdate is no answer; "revoked" stays revoked, and wins over "good".
    stale = dict(this=NOW - 3 * HOUR, until=NOW - 2 * HOUR)
    assert _status(platform, _answer(platform, **stale)) is OcspStatus.UNKNOWN  # type: ignore[arg-type]
    assert _status(platform, _answer(platform, revoked=True, **stale)) is OcspStatus.REVOKED  # type: ignore[arg-type]
    assert _status(platform, _answer(platform), _answer(platform, revoked=True)) is OcspStatus.REVOKED


def _forged(p: FakePlatform) -> bytes:
    """An answer naming GPU 0's leaf, signed by a key that is not its issuer's."""
    key = ec.generate_private_key(ec.SECP384R1())
    issuer = p.gpus[0].chain[1]
    impostor = (x509.CertificateBuilder().subject_name(issuer.subject).issuer_name(issuer.subject)
                .public_key(key.public_key()).serial_number(1).not_valid_before(NOW - HOUR)
                .not_valid_after(NOW + HOUR).sign(key, hashes.SHA384()))
    return (ocsp.OCSPResponseBuilder()
            .add_response(cert=p.gpus[0].chain[0], issuer=issuer, algorithm=hashes.SHA384(),
                          cert_status=ocsp.OCSPCertStatus.GOOD, this_update=NOW - HOUR, next_update=NOW + HOUR,
                          revocation_time=None, revocation_reason=None)
            .responder_id(ocsp.OCSPResponderEncoding.HASH, impostor)
            .sign(key, hashes.SHA384()).public_bytes(serialization.Encoding.DER))


def test_an_edited_or_future_answer_is_refused(platform: FakePlatform) -> None:
    forged = _forged(platform)
    with pytest.raises(CollateralError, match="does not verify"):
        _status(platform, forged)
    with pytest.raises(CollateralError, match="from the future"):
        _status(platform, _answer(platform, this=NOW + 2 * HOUR, until=NOW + 3 * HOUR))


@pytest.mark.parametrize("blob", [b"", b"\x30\x03\x0a\x01\x00", b"junk" * 10, b"\x30" * (70 << 10)])
def test_malformed_answers_are_refused(blob: bytes) -> None:
    with pytest.raises(ParseError):
        ImportedOcspChecker.of([blob])


def test_the_store_imports_ocsp_and_one_rim_per_version(platform: FakePlatform, tmp_path: Path) -> None:
    store = CollateralStore(CollateralConfig(tmp_path / "store", offline=True))
    assert store.import_file(_answer(platform)).kind == "ocsp"
    signer = platform.rim
    assert signer is not None
    first = gpu_pki.sign_rim(gpu_pki.rim_xml(DRIVER, {0: (b"\x01" * 48,)}), signer.chain, signer.keys[0])
    second = gpu_pki.sign_rim(gpu_pki.rim_xml(DRIVER, {0: (b"\x02" * 48,)}), signer.chain, signer.keys[0])
    assert store.import_file(first).subject == DRIVER
    store.import_file(second)  # NVIDIA reissued the RIM for this version: it replaces the first
    loaded = store.nvidia.load()
    assert loaded.rims == (second,)
    assert loaded.ocsp.status(platform.gpus[0].chain[0], platform.gpus[0].chain[1], NOW) is OcspStatus.GOOD
    for bad in (b"<SoftwareIdentity/>", b"<not-a-rim>", b"\x30\x03\x0a\x01\x01"):  # the last: tryLater
        with pytest.raises(CollateralError):
            store.import_file(bad, "bad")


def _bundle(p: FakePlatform, gpu: int, measurements: dict[int, bytes] | None = None,
            log: bytes = b"") -> tuple[EvidenceBundle, bytes]:
    rt = RuntimeData(nonce=os.urandom(32), hpke_public_key=os.urandom(32))
    ident = p.gpus[gpu]
    gpus = (GpuEvidence("hopper", gpu_report(ident, gpu, rt.nonce, measurements), ident.chain_pem()),)
    quote = p.tdx_quote(expected_report_data(rt, gpus), log)
    return EvidenceBundle("tdx", quote, rt, gpus=gpus, event_log=log), rt.nonce


def _trust(p: FakePlatform, collateral: Path, *, gpu: bool = True) -> VerifierTrust:
    store = CollateralStore(CollateralConfig(collateral, offline=True))
    return VerifierTrust(roots_dir=p.root / "roots", tdx_collateral=store.tdx,
                         gpu_collateral=store.nvidia if gpu else None)


def test_the_verifier_appraises_gpus_with_the_imported_collateral(platform: FakePlatform) -> None:
    trust = _trust(platform, platform.root / "collateral")
    bundle, nonce = _bundle(platform, 0)
    (gpu,) = verify_bundle(bundle, expected_nonce=nonce, now=NOW, trust=trust).token_claims()["gpus"]
    assert (gpu["rim_matched"], gpu["ocsp_status"]) == (True, "good")
    bundle, nonce = _bundle(platform, 0, tampered_measurements())
    (gpu,) = verify_bundle(bundle, expected_nonce=nonce, now=NOW, trust=trust).token_claims()["gpus"]
    assert (gpu["rim_matched"], gpu["ocsp_status"]) == (False, "good")
    # Without the collateral (as on main): nothing compared, nothing known about revocation.
    bundle, nonce = _bundle(platform, 0, tampered_measurements())
    (gpu,) = verify_bundle(bundle, expected_nonce=nonce, now=NOW,
                           trust=_trust(platform, platform.root / "collateral", gpu=False)).token_claims()["gpus"]
    assert (gpu["rim_matched"], gpu["ocsp_status"]) == (None, "unknown")


def test_a_gpu_is_matched_only_against_both_its_driver_and_vbios_rims(platform: FakePlatform, tmp_path: Path) -> None:
    """An operator who imports only the VBIOS RIM must not get a modified driver through."""
    store = CollateralStore(CollateralConfig(tmp_path / "store", offline=True))
    for f in sorted((platform.root / "bundle").rglob("*")):
        if f.is_file() and f.name != "rim-driver.xml":
            store.import_file(f.read_bytes(), f.name)
    bundle, nonce = _bundle(platform, 0)
    result = verify_bundle(bundle, expected_nonce=nonce, now=NOW, trust=_trust(platform, tmp_path / "store"))
    assert (result.gpus[0].rim_matched, result.gpus[0].ocsp_status) == (None, "good")
    policy = AppraisalPolicy(allowed_tee=frozenset({"tdx"}), allowed_measurements=frozenset({"7d" * 48}),
                             require_gpu_rim_match=True)
    with pytest.raises(PolicyViolation, match="no imported driver and VBIOS RIMs for GPU 0"):
        appraise(result.token_claims(), policy)


def test_the_client_policy_refuses_what_the_release_policy_refuses(platform: FakePlatform) -> None:
    trust = _trust(platform, platform.root / "collateral")
    expected = {f"rtmr{i}": r.hex() for i, r in enumerate(replay_rtmrs(parse_cc_event_log(CCEL)))}
    policy = AppraisalPolicy.from_dict({
        "allowed_tee": ["tdx"], "allowed_measurements": [bytes([0x7d] * 48).hex()], "require_gpu_cc": True,
        "require_gpu_rim_match": True, "require_gpu_ocsp_good": True,
        "allowed_rtmrs": [{"rtmr1": expected["rtmr1"], "rtmr2": expected["rtmr2"]}]})
    bundle, nonce = _bundle(platform, 0, log=CCEL)
    appraise(verify_bundle(bundle, expected_nonce=nonce, now=NOW, trust=trust).token_claims(), policy)
    changed = with_kernel_cmdline(CCEL, kernel_cmdline(CCEL).replace("loglevel=7", "loglevel=8"))
    bundle, nonce = _bundle(platform, 0, tampered_measurements(), log=changed)
    with pytest.raises(PolicyViolation) as refused:
        appraise(verify_bundle(bundle, expected_nonce=nonce, now=NOW, trust=trust).token_claims(), policy)
    assert len(refused.value.violations) == 2, refused.value.violations  # the boot chain and the RIM
    with pytest.raises(PolicyViolation):
        AppraisalPolicy.from_dict({"allowed_rtmrs": [{"rtmr9": expected["rtmr1"]}]})


def test_a_changed_command_line_changes_rtmr2_only() -> None:
    """The fake is honest: the rewritten log differs in the command-line event alone, so the
    replay differs in the RTMR that event extends (RTMR2 on GRUB's TDX boot) and nowhere else."""
    before = replay_rtmrs(parse_cc_event_log(CCEL))
    after = replay_rtmrs(parse_cc_event_log(with_kernel_cmdline(CCEL, kernel_cmdline(CCEL) + " quiet")))
    assert [a == b for a, b in zip(before, after, strict=True)] == [True, True, False, True]
    assert replay_rtmrs(parse_cc_event_log(with_kernel_cmdline(CCEL, kernel_cmdline(CCEL)))) == before
