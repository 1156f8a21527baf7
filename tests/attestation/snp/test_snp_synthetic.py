"""Reports signed under a test AMD PKI: collect (fake configfs) -> verify -> validate -> claims,
for report versions 2, 3, 5, every product (Turin TCB layout included), VCEK and VLEK; and a
negative table where every case names the typed error it must raise."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from attestation.errors import (
    ChainError,
    CollateralError,
    ParseError,
    PolicyViolation,
    RevokedError,
    SignatureError,
    UnsupportedError,
)
from attestation.snp import Policy, TcbVersion, to_claims, validate, verify_report
from attestation.snp.certs import VekKind
from attestation.snp.collect import encode_cert_table, parse_cert_table
from attestation.snp.tcb import POLICY_DEBUG, POLICY_RESERVED_ONE, Product, SignerInfo, SigningKey
from attestation.tsm import DirectoryConfigfsFake, TsmReportClient
from sealed_fakes.snp_pki import EPOCH, AmdTestPki, KeySet, sign_report, template_report

NOW = EPOCH + dt.timedelta(days=100)
DER = serialization.Encoding.DER
PEM = serialization.Encoding.PEM


def _signer(kind: VekKind) -> int:
    key = SigningKey.VCEK if kind is VekKind.VCEK else SigningKey.VLEK
    return SignerInfo(author_key_en=False, mask_chip_key=False, signing_key=key).encode()


def _configfs(base: Path, outblob: bytes, certs: dict[str, bytes], inblobs: list[bytes]) -> TsmReportClient:
    """The product's configfs-tsm client over a directory that plays the kernel: each write of inblob
    (recorded in `inblobs`) yields the signed report in outblob, the host's certificates in auxblob."""

    def make_report(inblob: bytes, privlevel: int) -> bytes:
        inblobs.append(inblob)
        return outblob

    base.mkdir(parents=True)
    return TsmReportClient(base, ops=DirectoryConfigfsFake(make_report, "sev_guest", encode_cert_table(certs)))


CASES = [(p, v, VekKind.VCEK) for p in Product for v in (2, 3, 5)] + [
    (Product.MILAN, 3, VekKind.VLEK),
    (Product.TURIN, 5, VekKind.VLEK),
]


@pytest.mark.parametrize(("product", "version", "kind"), CASES, ids=[f"{p}-v{v}-{k}" for p, v, k in CASES])
def test_collect_verify_validate_claims(
    tmp_path: Path,
    pkis: dict[Product, AmdTestPki],
    test_keys: KeySet,
    roots_dir: Path,
    product: Product,
    version: int,
    kind: VekKind,
) -> None:
    pki = pkis[product]
    nonce = bytes(range(100, 164))
    chip = bytes(64) if kind is VekKind.VLEK else bytes(range(1, 65))
    rep = template_report(
        version, product, report_data=nonce, chip_id=chip, signer_info=_signer(kind), host_data=b"\x42" * 32
    )
    vek = pki.make_vek(rep.tcb("reported", product), rep.chip_id, kind=kind)
    mid = pki.asvk if kind is VekKind.VLEK else pki.ask
    inblobs: list[bytes] = []
    client = _configfs(tmp_path / "report", sign_report(rep, test_keys.vek),
                       {kind.value: vek.public_bytes(DER), "ask": mid.public_bytes(DER)}, inblobs)
    tsm = client.get_report(nonce)
    assert inblobs == [nonce] and tsm.provider == "sev_guest"
    certs = parse_cert_table(tsm.auxblob or b"")
    assert set(certs) == {kind.value, "ask"}

    vr = verify_report(tsm.outblob, now=NOW, certs=list(certs.values()), roots_dir=roots_dir)
    assert vr.product is product and vr.signer is kind and vr.report.version == version
    if product is Product.TURIN:
        assert vr.reported_tcb.fmc == 1 and vr.reported_tcb.bl == 3
    policy = Policy(
        allowed_measurements=frozenset({rep.measurement}),
        min_tcb=TcbVersion(bl=3, tee=0, snp=8, ucode=115),
        report_data=nonce,
        host_data=b"\x42" * 32,
        allowed_products=frozenset({product}),
    )
    validate(vr, policy)
    claims = to_claims(vr)
    assert claims.tee.value == "snp" and claims.tcb_status.value == "UpToDate" and not claims.debug
    assert claims.report_data == nonce and claims.measurement == rep.measurement
    assert claims.extra["host_data"] == "42" * 32 and claims.extra["signer"] == kind.value
    assert claims.tcb["snp"] == 8 and ("fmc" in claims.tcb) == (product is Product.TURIN)
    assert ("current_mit_vector" in claims.extra) == (version == 5)


def test_validate_reports_all_violations(
    pkis: dict[Product, AmdTestPki], test_keys: KeySet, roots_dir: Path
) -> None:
    pki = pkis[Product.GENOA]
    rep = template_report(3, Product.GENOA, policy=POLICY_RESERVED_ONE | POLICY_DEBUG | (1 << 18), vmpl=2)
    vek = pki.make_vek(rep.tcb("reported", Product.GENOA), rep.chip_id)
    vr = verify_report(sign_report(rep, test_keys.vek), vek=vek, now=NOW, roots_dir=roots_dir)
    policy = Policy.from_dict(
        {
            "allowed_measurements": ["00" * 48],
            "min_tcb": {"snp": 9},
            "report_data": "11" * 64,
            "min_guest_svn": 5,
            "allowed_products": ["Milan"],
            "require_crl": True,
        }
    )
    with pytest.raises(PolicyViolation) as err:
        validate(vr, policy)
    text = "\n".join(err.value.violations)
    for needle in (
        "measurement",
        "reported_tcb.snp",
        "DEBUG",
        "MIGRATE_MA",
        "VMPL 2",
        "report_data",
        "GUEST_SVN",
        "product Genoa",
        "CRL",
    ):
        assert needle in text
    assert len(err.value.violations) == 9
    with pytest.raises(ParseError, match="unknown SNP policy keys"):
        Policy.from_dict({"allow_debugg": True})


Mutator = Callable[[dict[str, Any]], None]


def _field(**kw: Any) -> Mutator:
    return lambda ctx: ctx.update(report=dataclasses.replace(ctx["report"], **kw))


def _raw(fn: Callable[[bytearray], None], resign: bool = True) -> Mutator:
    def mutate(ctx: dict[str, Any]) -> None:
        ctx["raw_mutator"] = fn
        ctx["resign"] = resign

    return mutate


def _vek(**kw: Any) -> Mutator:
    return lambda ctx: ctx["vek_kw"].update(kw)


def _set(key: str, value: Any) -> Mutator:
    return lambda ctx: ctx.update({key: value})


def _set_bytes(off: int, value: int) -> Callable[[bytearray], None]:
    def fn(b: bytearray) -> None:
        b[off] = value

    return fn


NEGATIVE: list[tuple[str, Mutator, type[Exception]]] = [
    ("wrong_root", _set("roots", "wrong"), ChainError),
    ("expired_vcek", _vek(not_after=NOW - dt.timedelta(days=1)), ChainError),
    ("vcek_not_yet_valid", _vek(not_before=NOW + dt.timedelta(days=1)), ChainError),
    ("revoked_vcek_crl", _set("crl", ("ask", [7])), RevokedError),
    ("revoked_ask_by_ark_crl", _set("crl", ("ark", "ask")), RevokedError),
    ("expired_crl", _set("crl_expired", True), ChainError),
    ("foreign_crl_signature", _set("crl_foreign", True), ChainError),
    ("tcb_mismatch_with_cert", _vek(tcb=TcbVersion(bl=3, tee=0, snp=9, ucode=115)), CollateralError),
    ("hwid_mismatch", _vek(hwid=b"\x99" * 64), CollateralError),
    ("bad_reserved_0x4c", _raw(_set_bytes(0x4C, 1)), ParseError),
    ("bad_reserved_tail", _raw(_set_bytes(0x250, 1)), ParseError),
    ("bad_reserved_sig_tail", _raw(_set_bytes(0x400, 1), resign=False), ParseError),
    ("wrong_length_short", _set("truncate", 1183), ParseError),
    ("wrong_length_long", _set("truncate", 1185), ParseError),
    ("unknown_version_4", _field(version=4), UnsupportedError),
    ("unknown_version_1", _field(version=1), UnsupportedError),
    ("signature_algo_2", _field(signature_algo=2), SignatureError),
    ("vlek_signer_with_vcek_cert", _field(signer_info=_signer(VekKind.VLEK)), ChainError),
    ("vcek_signer_with_vlek_cert", _vek(kind=VekKind.VLEK), ChainError),
    ("unsigned_report", _field(signer_info=7 << 2), SignatureError),
    ("mask_chip_key", _field(signer_info=0b10), SignatureError),
    ("reserved_signing_key", _field(signer_info=2 << 2), ParseError),
    ("policy_bit17_clear", _field(policy=0), ParseError),
    ("policy_reserved_high", _field(policy=POLICY_RESERVED_ONE | 1 << 40), ParseError),
    ("platform_info_reserved", _field(platform_info=1 << 6), ParseError),
    ("vmpl_out_of_range", _field(vmpl=4), ParseError),
    ("cpuid_product_mismatch", _field(cpuid_fam_id=0x19, cpuid_mod_id=0x11), ChainError),
    ("unknown_cpuid", _field(cpuid_fam_id=0x17, cpuid_mod_id=0x31), UnsupportedError),
    ("tcb_reserved_bytes", _field(reported_tcb=1 << 24), ParseError),
    ("wrong_signing_key", _set("sign_key", "other"), SignatureError),
    ("foreign_ark_supplied", _set("extra_ark", True), ChainError),
    ("p256_vek", _vek(key=ec.generate_private_key(ec.SECP256R1())), ChainError),
    ("no_vek_no_fetcher", _set("no_vek", True), CollateralError),
]


# Why each case must fail: a fragment of the message, so an incidental earlier failure cannot pass.
MATCH = {
    "wrong_root": "does not verify under its issuer",
    "expired_vcek": "is after",
    "vcek_not_yet_valid": "is before",
    "revoked_vcek_crl": "SEV-VCEK.* is revoked",
    "revoked_ask_by_ark_crl": "SEV-Milan.* is revoked",
    "expired_crl": "CRL expired",
    "foreign_crl_signature": "CRL signature",
    "tcb_mismatch_with_cert": "REPORTED_TCB",
    "hwid_mismatch": "hwID",
    "bad_reserved_0x4c": "0x4c",
    "bad_reserved_tail": "0x1f8",
    "bad_reserved_sig_tail": "0x330",
    "wrong_length_short": "got 1183",
    "wrong_length_long": "got 1185",
    "unknown_version_4": "version 4",
    "unknown_version_1": "version 1",
    "signature_algo_2": "SIGNATURE_ALGO 2",
    "vlek_signer_with_vcek_cert": "signed by a VLEK",
    "vcek_signer_with_vlek_cert": "signed by a VCEK",
    "unsigned_report": "unsigned",
    "mask_chip_key": "MASK_CHIP_KEY",
    "reserved_signing_key": "SIGNING_KEY",
    "policy_bit17_clear": "bit 17",
    "policy_reserved_high": "reserved bits 26-63",
    "platform_info_reserved": "PLATFORM_INFO",
    "vmpl_out_of_range": "VMPL 4",
    "cpuid_product_mismatch": "CPUID is Genoa",
    "unknown_cpuid": "family 0x17",
    "tcb_reserved_bytes": "reserved bytes 2-5",
    "wrong_signing_key": "signature does not verify",
    "foreign_ark_supplied": "not the pinned AMD root",
    "p256_vek": "P-384",
    "no_vek_no_fetcher": "no VCEK/VLEK supplied",
}


@pytest.mark.parametrize(("name", "mutate", "error"), NEGATIVE, ids=[n for n, _, _ in NEGATIVE])
def test_negative(
    name: str,
    mutate: Mutator,
    error: type[Exception],
    pkis: dict[Product, AmdTestPki],
    test_keys: KeySet,
    other_keys: KeySet,
    roots_dir: Path,
    wrong_roots_dir: Path,
) -> None:
    pki = pkis[Product.MILAN]
    ctx: dict[str, Any] = {"report": template_report(3, Product.MILAN), "vek_kw": {}}
    mutate(ctx)
    rep = ctx["report"]
    vek_kw = {"tcb": TcbVersion(bl=3, tee=0, snp=8, ucode=115), "chip_id": rep.chip_id, "serial": 7}
    vek_kw.update(ctx["vek_kw"])
    vek = pki.make_vek(**vek_kw)
    key = other_keys.vek if ctx.get("sign_key") else test_keys.vek
    raw = sign_report(rep, key)
    if "raw_mutator" in ctx:
        b = bytearray(raw)
        ctx["raw_mutator"](b)
        if ctx["resign"]:
            b = bytearray(_resign(bytes(b), key))
        raw = bytes(b)
    if "truncate" in ctx:
        raw = (raw + b"\0")[: ctx["truncate"]]
    crls: list[bytes] = []
    if "crl" in ctx:
        issuer, serials = ctx["crl"]
        crls.append(pki.make_crl([pki.ask.serial_number] if serials == "ask" else serials, issuer=issuer))
    if ctx.get("crl_expired"):
        crls.append(pki.make_crl([], next_update=NOW - dt.timedelta(days=1), last_update=EPOCH))
    if ctx.get("crl_foreign"):
        from sealed_fakes.snp_pki import make_pki

        crls.append(make_pki(other_keys, Product.MILAN).make_crl([]))
    certs: list[bytes] = []
    if ctx.get("extra_ark"):
        from sealed_fakes.snp_pki import make_pki

        certs.append(make_pki(other_keys, Product.MILAN).ark.public_bytes(PEM))
    roots = wrong_roots_dir if ctx.get("roots") == "wrong" else roots_dir
    with pytest.raises(error, match=MATCH[name]):
        verify_report(
            raw, vek=None if ctx.get("no_vek") else vek, certs=certs, crls=crls, now=NOW, roots_dir=roots
        )


def _resign(raw: bytes, key: ec.EllipticCurvePrivateKey) -> bytes:
    """Sign arbitrary (possibly malformed) bytes in place, so only the malformation can fail."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

    r, s = decode_dss_signature(key.sign(raw[:0x2A0], ec.ECDSA(hashes.SHA384())))
    return raw[:0x2A0] + r.to_bytes(72, "little") + s.to_bytes(72, "little") + raw[0x2A0 + 144 :]
