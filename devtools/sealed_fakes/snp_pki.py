"""Test PKI in AMD's real formats, for tests and benchmarks only (never trusted by default).

RSA-4096 ARK/ASK/ASVK with RSASSA-PSS SHA-384 signatures, P-384 VCEK/VLEK carrying the KDS
extensions, CRLs, and reports signed the way the AMD-SP signs them (Table 137 little-endian R, S).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

from attestation.snp import certs as c
from attestation.snp.abi import SIGNED_SIZE, Report, encode_report
from attestation.snp.tcb import POLICY_RESERVED_ONE, POLICY_SMT, Product, TcbVersion

PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=48)
CPUID = {Product.MILAN: (0x19, 0x01, 1), Product.GENOA: (0x19, 0x11, 1), Product.TURIN: (0x1A, 0x02, 0)}
EPOCH = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class RealVector:
    """A real report, the VEK that signed it, and a time inside every certificate's validity."""

    report: str
    vek: str
    product: Product
    kind: c.VekKind
    at: dt.datetime


@dataclass(frozen=True)
class KeySet:
    """Private keys, generated once per session because RSA-4096 generation is slow."""

    ark: rsa.RSAPrivateKey
    ask: rsa.RSAPrivateKey
    asvk: rsa.RSAPrivateKey
    vek: ec.EllipticCurvePrivateKey


def generate_keys(rsa_bits: int = 4096) -> KeySet:
    def gen() -> rsa.RSAPrivateKey:
        return rsa.generate_private_key(public_exponent=65537, key_size=rsa_bits)

    return KeySet(gen(), gen(), gen(), ec.generate_private_key(ec.SECP384R1()))


def _name(cn: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "Engineering"),
            x509.NameAttribute(NameOID.COUNTRY_NAME, "US"),
            x509.NameAttribute(NameOID.LOCALITY_NAME, "Santa Clara"),
            x509.NameAttribute(NameOID.STATE_OR_PROVINCE_NAME, "CA"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Advanced Micro Devices"),
            x509.NameAttribute(NameOID.COMMON_NAME, cn),
        ]
    )


def der_int(v: int) -> bytes:
    body = v.to_bytes(v.bit_length() // 8 + 1, "big")
    return bytes([0x02, len(body)]) + body


def der_ia5(s: str) -> bytes:
    return bytes([0x16, len(s)]) + s.encode()


def _ca(
    subject: str,
    issuer: str,
    key: rsa.RSAPrivateKey,
    signer: rsa.RSAPrivateKey,
    nb: dt.datetime,
    na: dt.datetime,
) -> x509.Certificate:
    b = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(nb)
        .not_valid_after(na)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=False)
    )
    return b.sign(signer, hashes.SHA384(), rsa_padding=PSS)


@dataclass(frozen=True)
class AmdTestPki:
    product: Product
    keys: KeySet
    ark: x509.Certificate
    ask: x509.Certificate
    asvk: x509.Certificate

    def write_roots(self, directory: Path) -> Path:
        """Write amd_<product>_ask_ark.pem and amd_<product>_vlek_asvk_ark.pem (intermediate first)."""
        directory.mkdir(parents=True, exist_ok=True)
        pem = serialization.Encoding.PEM
        p = self.product.value.lower()
        (directory / f"amd_{p}_ask_ark.pem").write_bytes(
            self.ask.public_bytes(pem) + self.ark.public_bytes(pem)
        )
        (directory / f"amd_{p}_vlek_asvk_ark.pem").write_bytes(
            self.asvk.public_bytes(pem) + self.ark.public_bytes(pem)
        )
        return directory

    def make_vek(
        self,
        tcb: TcbVersion,
        chip_id: bytes = b"",
        *,
        kind: c.VekKind = c.VekKind.VCEK,
        not_before: dt.datetime = EPOCH,
        not_after: dt.datetime = EPOCH + dt.timedelta(days=2555),
        serial: int = 1,
        key: ec.EllipticCurvePrivateKey | None = None,
        hwid: bytes | None = None,
        product_name: str | None = None,
    ) -> x509.Certificate:
        """A VCEK (hwID = CHIP_ID, or its first 8 bytes on Turin) or a VLEK (csp_id instead)."""
        key = key or self.keys.vek
        vlek = kind is c.VekKind.VLEK
        exts: list[tuple[str, bytes]] = [
            (c.OID_STRUCT_VERSION, der_int(1)),
            (c.OID_PRODUCT_NAME, der_ia5(product_name or self.product.value)),
            (c.OID_BL_SPL, der_int(tcb.bl)),
            (c.OID_TEE_SPL, der_int(tcb.tee)),
            (c.OID_SNP_SPL, der_int(tcb.snp)),
            (c.OID_UCODE_SPL, der_int(tcb.ucode)),
        ]
        if tcb.fmc is not None:
            exts.append((c.OID_FMC_SPL, der_int(tcb.fmc)))
        if vlek:
            exts.append((c.OID_CSP_ID, der_ia5("CN=test-csp.example")))
        else:
            exts.append(
                (
                    c.OID_HWID,
                    hwid if hwid is not None else (chip_id[:8] if self.product.fmc_layout else chip_id),
                )
            )
        issuer = self.asvk if vlek else self.ask
        b = (
            x509.CertificateBuilder()
            .subject_name(_name("SEV-VLEK" if vlek else "SEV-VCEK"))
            .issuer_name(issuer.subject)
            .public_key(key.public_key())
            .serial_number(serial)
            .not_valid_before(not_before)
            .not_valid_after(not_after)
        )
        for oid, value in exts:
            b = b.add_extension(x509.UnrecognizedExtension(x509.ObjectIdentifier(oid), value), critical=False)
        return b.sign(self.keys.asvk if vlek else self.keys.ask, hashes.SHA384(), rsa_padding=PSS)

    def make_crl(
        self,
        serials: list[int],
        *,
        issuer: str = "ark",
        last_update: dt.datetime = EPOCH,
        next_update: dt.datetime = EPOCH + dt.timedelta(days=3650),
    ) -> bytes:
        """A DER CRL signed (RSA-PSS) by the ARK (as KDS serves) or by the ASK/ASVK."""
        cert, key = {
            "ark": (self.ark, self.keys.ark),
            "ask": (self.ask, self.keys.ask),
            "asvk": (self.asvk, self.keys.asvk),
        }[issuer]
        b = (
            x509.CertificateRevocationListBuilder()
            .issuer_name(cert.subject)
            .last_update(last_update)
            .next_update(next_update)
        )
        for s in serials:
            b = b.add_revoked_certificate(
                x509.RevokedCertificateBuilder().serial_number(s).revocation_date(last_update).build()
            )
        crl = b.sign(key, hashes.SHA384(), rsa_padding=PSS)
        return crl.public_bytes(serialization.Encoding.DER)


def make_pki(
    keys: KeySet,
    product: Product = Product.MILAN,
    *,
    not_before: dt.datetime = EPOCH,
    not_after: dt.datetime = EPOCH + dt.timedelta(days=9000),
) -> AmdTestPki:
    p = product.value
    ark = _ca(f"ARK-{p}", f"ARK-{p}", keys.ark, keys.ark, not_before, not_after)
    ask = _ca(f"SEV-{p}", f"ARK-{p}", keys.ask, keys.ark, not_before, not_after)
    asvk = _ca(f"SEV-VLEK-{p}", f"ARK-{p}", keys.asvk, keys.ark, not_before, not_after)
    return AmdTestPki(product, keys, ark, ask, asvk)


def template_report(
    version: int = 3, product: Product = Product.MILAN, tcb: TcbVersion | None = None, **overrides: object
) -> Report:
    """An unsigned, well-formed report of `version` for `product` (override any field)."""
    tcb = tcb or (
        TcbVersion(fmc=1, bl=3, tee=0, snp=8, ucode=115)
        if product.fmc_layout
        else TcbVersion(bl=3, tee=0, snp=8, ucode=115)
    )
    fam, mod, step = CPUID[product] if version >= 3 else (0, 0, 0)
    raw_tcb = tcb.encode()
    fields: dict[str, object] = dict(
        version=version,
        guest_svn=1,
        policy=POLICY_RESERVED_ONE | POLICY_SMT,
        family_id=bytes(16),
        image_id=bytes(16),
        vmpl=0,
        signature_algo=1,
        current_tcb=raw_tcb,
        platform_info=0x1,
        signer_info=0,
        report_data=bytes(64),
        measurement=bytes(range(48)),
        host_data=bytes(32),
        id_key_digest=bytes(48),
        author_key_digest=bytes(48),
        report_id=b"\x11" * 32,
        report_id_ma=b"\xff" * 32,
        reported_tcb=raw_tcb,
        cpuid_fam_id=fam,
        cpuid_mod_id=mod,
        cpuid_step=step,
        chip_id=bytes(range(64)),
        committed_tcb=raw_tcb,
        current_build=40,
        current_minor=55,
        current_major=1,
        committed_build=40,
        committed_minor=55,
        committed_major=1,
        launch_tcb=raw_tcb,
        launch_mit_vector=0x3 if version >= 5 else 0,
        current_mit_vector=0x3 if version >= 5 else 0,
        signature_r=0,
        signature_s=0,
    )
    fields.update(overrides)
    return Report(**fields)  # type: ignore[arg-type]


def sign_report(report: Report, key: ec.EllipticCurvePrivateKey) -> bytes:
    """Serialise `report` and sign [0, 0x2A0) with ECDSA P-384/SHA-384 (R, S little-endian)."""
    body = encode_report(dataclasses.replace(report, signature_r=0, signature_s=0))[:SIGNED_SIZE]
    r, s = decode_dss_signature(key.sign(body, ec.ECDSA(hashes.SHA384())))
    return encode_report(dataclasses.replace(report, signature_r=r, signature_s=s))
