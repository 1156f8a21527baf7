"""Verify NVIDIA Hopper GPU evidence: certificate chain, SPDM signature, nonce, FWID, OCSP, RIMs.

Steps follow NVIDIA's GPU attestation flow (nvtrust local GPU verifier; NVIDIA "Confidential
Computing Deployment Guide", attestation section) over DMTF DSP0274 SPDM 1.1 messages.
"""

from __future__ import annotations

import datetime as dt
import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from cryptography.hazmat.primitives.serialization import Encoding

from attestation.errors import ChainError, CollateralError, FreshnessError, ParseError, SignatureError
from attestation.nvgpu.abi import NONCE_LEN, SIGNATURE_LEN, GpuEvidence, parse_evidence
from attestation.nvgpu.rim import Rim, RimComparison, compare_rim, parse_rim, verify_rim
from attestation.ocsp import OcspChecker, OcspStatus, OfflineOcspChecker, check_chain_ocsp
from attestation.x509chain import load_pem_chain, load_pinned_roots, verify_chain

DEVICE_ROOT = "nvidia_device_identity_ca.pem"
RIM_ROOT = "nvidia_rim_root.pem"
CHAIN_LEN = 5  # FMC LF -> GSP BROM -> Provisioner ICA -> GH100 Identity -> Device Identity CA
FWID_OID = x509.ObjectIdentifier("2.23.133.5.4.1")  # TCG DICE TcbInfo, carries the FMC FWID
SHA384_OID_DER = bytes.fromhex("0609608648016503040202")  # OID 2.16.840.1.101.3.4.2.2


@dataclass(frozen=True)
class VerifiedGpu:
    evidence: GpuEvidence
    chain: tuple[x509.Certificate, ...]
    ueid: str  # decimal X.509 serial of the leaf, as NRAS reports it
    ocsp_status: OcspStatus  # worst non-revoked answer over the device chain (and RIM chains)
    rims: tuple[Rim, ...] = ()
    rim_results: tuple[RimComparison, ...] = ()
    # A signed SPDM report is only served by a GPU in CC mode (NVML refuses otherwise). The
    # devtools check is on the attester (collect.py), since the report does not carry it.
    cc_enabled: bool = True

    @property
    def rim_matched(self) -> bool | None:
        if not self.rim_results:
            return None
        return all(not r.mismatched for r in self.rim_results)


def _der_items(data: bytes) -> list[tuple[int, bytes]]:
    """Split DER into (tag, value) pairs; definite lengths only, which DER requires."""
    items: list[tuple[int, bytes]] = []
    off = 0
    while off < len(data):
        if len(data) - off < 2:
            raise ChainError("FWID extension: truncated DER")
        tag, first = data[off], data[off + 1]
        off += 2
        if first < 0x80:
            size = first
        else:
            n = first & 0x7F
            if n == 0 or n > 3 or len(data) - off < n:
                raise ChainError("FWID extension: bad DER length")
            size = int.from_bytes(data[off : off + n], "big")
            off += n
        if len(data) - off < size:
            raise ChainError("FWID extension: DER value overruns")
        items.append((tag, data[off : off + size]))
        off += size
    return items


def cert_fwid(cert: x509.Certificate) -> bytes:
    """FWID from the leaf's 2.23.133.5.4.1 extension: SEQUENCE {..., SEQUENCE {sha384 OID, OCTET STRING}}.

    NVIDIA's encoding ends with one FWID (hash OID + 48-byte digest); trustee reads the last 48
    bytes. We parse the DER and require exactly that shape, so a different layout is an error.
    """
    try:
        ext = cert.extensions.get_extension_for_oid(FWID_OID)
    except x509.ExtensionNotFound as exc:
        where = cert.subject.rfc4514_string()
        raise ChainError(f"FWID extension (2.23.133.5.4.1) not found in {where}") from exc
    raw = ext.value.value if isinstance(ext.value, x509.UnrecognizedExtension) else b""
    outer = _der_items(raw)
    if len(outer) != 1 or outer[0][0] != 0x30:
        raise ChainError("FWID extension is not one DER SEQUENCE")
    inner = _der_items(outer[0][1])
    if not inner or inner[-1][0] != 0x30:
        raise ChainError("FWID extension does not end with an FWID SEQUENCE")
    fwid = _der_items(inner[-1][1])
    if len(fwid) != 2 or fwid[0] != (0x06, SHA384_OID_DER[2:]) or fwid[1][0] != 0x04 or len(fwid[1][1]) != 48:
        raise ChainError("FWID extension: expected a SHA-384 FWID of 48 bytes")
    return fwid[1][1]


def _check_signature(evidence: GpuEvidence, leaf: x509.Certificate) -> None:
    key = leaf.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp384r1":
        raise SignatureError("the GPU leaf key is not ECDSA P-384")
    half = SIGNATURE_LEN // 2
    r = int.from_bytes(evidence.signature[:half], "big")
    s = int.from_bytes(evidence.signature[half:], "big")
    try:
        key.verify(encode_dss_signature(r, s), evidence.signed, ec.ECDSA(hashes.SHA384()))
    except (InvalidSignature, ValueError) as exc:
        raise SignatureError("SPDM MEASUREMENTS signature does not verify with the GPU leaf key") from exc


def verify_gpu_evidence(
    evidence: bytes | GpuEvidence,
    chain: Sequence[x509.Certificate] | bytes,
    *,
    nonce: bytes,
    now: dt.datetime,
    roots: Sequence[x509.Certificate] | None = None,
    rim_roots: Sequence[x509.Certificate] | None = None,
    roots_dir: Path | None = None,
    ocsp: OcspChecker | None = None,
    rims: Sequence[bytes] = (),
) -> VerifiedGpu:
    """Verify one GPU's report against its certificate chain (leaf first) and the pinned roots."""
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    checker = ocsp if ocsp is not None else OfflineOcspChecker()
    # Step 1: parse request || MEASUREMENTS at exact offsets (DSP0274 1.1 GET_MEASUREMENTS clause).
    ev = evidence if isinstance(evidence, GpuEvidence) else parse_evidence(evidence)
    # Step 2: chain shape. A root alone cannot sign anything (trustee case 2).
    certs = load_pem_chain(chain) if isinstance(chain, bytes) else list(chain)
    if len(certs) < 2:
        raise ChainError("certificate chain must hold at least the root CA and the signing certificate")
    # Step 3: the leaf must be the FMC layer that carries the FWID extension (trustee case 4).
    leaf_fwid = cert_fwid(certs[0])
    # Step 4: every link up to the pinned NVIDIA Device Identity CA, valid at `now` (a missing
    # intermediate breaks a link: trustee case 3), and exactly the five Hopper layers.
    pinned = list(roots) if roots is not None else load_pinned_roots(DEVICE_ROOT, roots_dir)
    verify_chain(certs, pinned, now)
    if len(certs) != CHAIN_LEN:
        raise ChainError(f"GPU certificate chain has {len(certs)} certificates, expected {CHAIN_LEN}")
    # Step 5: OCSP for every certificate below the root; REVOKED raises RevokedError.
    status = check_chain_ocsp(certs, checker, now)
    # Step 6: DSP0274 1.1 measurement signature (L1/L2 transcript = request || response minus
    # Signature), ECDSA P-384 with SHA-384, as NVIDIA negotiates.
    _check_signature(ev, certs[0])
    # Step 7: freshness, the requester's nonce (GET_MEASUREMENTS offset 4) is the one we issued.
    if not isinstance(nonce, bytes) or len(nonce) != NONCE_LEN:
        raise FreshnessError(f"expected nonce must be {NONCE_LEN} bytes, got {nonce!r:.80}")
    if not hmac.compare_digest(ev.nonce, nonce):
        raise FreshnessError(f"GPU evidence nonce {ev.nonce.hex()} is not the expected {nonce.hex()}")
    # Step 8: the signed opaque FWID (type 20) binds this report to the leaf certificate's FWID.
    if ev.field("FWID") is None:
        raise ParseError("opaque data lacks the FWID field")
    if not hmac.compare_digest(ev.fwid, leaf_fwid):
        raise ChainError("FWID in the report does not match the leaf certificate's FWID")
    # Step 9: RIMs (driver and VBIOS reference values), each signed and chained to the RIM root.
    verified_rims: list[Rim] = []
    results: list[RimComparison] = []
    if rims:
        pinned_rim = list(rim_roots) if rim_roots is not None else load_pinned_roots(RIM_ROOT, roots_dir)
        for blob in rims:
            rim = verify_rim(blob, pinned_rim, now, checker)
            kind = _rim_kind(rim, ev)
            if any(r.kind == kind for r in results):
                raise CollateralError(f"more than one {kind} RIM for one GPU")
            verified_rims.append(rim)
            results.append(compare_rim(rim, ev.measurements, kind))
            if rim.ocsp_status != OcspStatus.GOOD:
                status = OcspStatus.UNKNOWN
        # Driver and VBIOS RIMs own disjoint indices; an overlap means one could mask the other.
        if len(verified_rims) == 2 and set(verified_rims[0].active()) & set(verified_rims[1].active()):
            raise CollateralError("driver and VBIOS RIMs both claim the same measurement index")
    return VerifiedGpu(
        evidence=ev, chain=tuple(certs), ueid=str(certs[0].serial_number), ocsp_status=status,
        rims=tuple(verified_rims), rim_results=tuple(results),
    )


def _rim_kind(rim: Rim, ev: GpuEvidence) -> str:
    """A RIM is for one VBIOS or driver version; appraising against another one is meaningless."""
    version = rim.version.upper()
    if version == ev.vbios_version.upper():
        return "vbios"
    if version == ev.driver_version.upper():
        return "driver"
    raise CollateralError(
        f"RIM version {rim.version} is neither the report's VBIOS {ev.vbios_version} "
        f"nor its driver {ev.driver_version}"
    )


def verify_gpu_list(
    items: Sequence[tuple[bytes | GpuEvidence, Sequence[x509.Certificate] | bytes]],
    *,
    nonce: bytes,
    now: dt.datetime,
    roots: Sequence[x509.Certificate] | None = None,
    rim_roots: Sequence[x509.Certificate] | None = None,
    roots_dir: Path | None = None,
    ocsp: OcspChecker | None = None,
    rims: Sequence[bytes] = (),
) -> list[VerifiedGpu]:
    """Verify every GPU of a multi-GPU bundle with the same nonce; one failure fails the bundle.

    Distinct leaf certificates are required: one GPU answering for all would otherwise pass.
    """
    if not items:
        raise ChainError("empty GPU evidence list")
    out: list[VerifiedGpu] = []
    for i, (ev, chain) in enumerate(items):
        applicable = _applicable_rims(ev, rims)
        try:
            out.append(verify_gpu_evidence(
                ev, chain, nonce=nonce, now=now, roots=roots, rim_roots=rim_roots,
                roots_dir=roots_dir, ocsp=ocsp, rims=applicable,
            ))
        except Exception as exc:
            exc.add_note(f"GPU {i}")
            raise
    used = {r.version.upper() for v in out for r in v.rims}
    unused = [parse_rim(r).version for r in rims if parse_rim(r).version.upper() not in used]
    if unused:
        raise CollateralError(f"RIMs for versions {unused} apply to no GPU in the bundle")
    leaves = {v.chain[0].public_bytes(Encoding.DER) for v in out}
    if len(leaves) != len(out):
        raise ChainError("two GPUs in the bundle present the same device certificate")
    return out


def _applicable_rims(ev: bytes | GpuEvidence, rims: Sequence[bytes]) -> list[bytes]:
    """In a mixed fleet, give each GPU only the RIMs for its own versions (others are not errors)."""
    if not rims:
        return []
    parsed = ev if isinstance(ev, GpuEvidence) else parse_evidence(ev)
    wanted = {parsed.vbios_version.upper(), parsed.driver_version.upper()}
    return [r for r in rims if parse_rim(r).version.upper() in wanted]

