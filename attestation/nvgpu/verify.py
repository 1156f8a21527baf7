"""Verify NVIDIA Hopper GPU evidence: certificate chain, SPDM signature, nonce, FWID, OCSP, RIMs.

Steps follow NVIDIA's GPU attestation flow (nvtrust local GPU verifier; NVIDIA "Confidential
Computing Deployment Guide", attestation section) over DMTF DSP0274 SPDM 1.1 messages.
"""

from __future__ import annotations

import dataclasses
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

from attestation import der
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
    try:
        inner = der.children(der.single(raw, der.TAG_SEQUENCE, "FWID extension"), "FWID extension")
        if not inner or inner[-1][0] != der.TAG_SEQUENCE:
            raise ChainError("FWID extension does not end with an FWID SEQUENCE")
        fwid = der.children(inner[-1][1], "FWID extension")
    except ParseError as exc:  # a leaf whose FWID cannot be read cannot be bound to the report
        raise ChainError(str(exc)) from exc
    if (len(fwid) != 2 or fwid[0] != (der.TAG_OID, SHA384_OID_DER[2:]) or fwid[1][0] != der.TAG_OCTET_STRING
            or len(fwid[1][1]) != 48):
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


@dataclass(frozen=True)
class GpuVerifyOptions:
    """What GPU evidence is checked against, beyond the nonce and the time of each call.

    roots / rim_roots: pinned device and RIM roots (default: the shipped NVIDIA roots, read from
    `roots_dir` when given); ocsp: the revocation source (default: offline, every status UNKNOWN);
    rims: signed reference values (SWID RIMs) to compare measurements with.
    """

    roots: tuple[x509.Certificate, ...] | None = None
    rim_roots: tuple[x509.Certificate, ...] | None = None
    roots_dir: Path | None = None
    ocsp: OcspChecker | None = None
    rims: tuple[bytes, ...] = ()


def verify_gpu_evidence(
    evidence: bytes | GpuEvidence,
    chain: Sequence[x509.Certificate] | bytes,
    *,
    nonce: bytes,
    now: dt.datetime,
    options: GpuVerifyOptions = GpuVerifyOptions(),  # frozen: one shared default is safe
) -> VerifiedGpu:
    """Verify one GPU's report against its certificate chain (leaf first) and the pinned roots."""
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    roots, rim_roots, roots_dir, rims = options.roots, options.rim_roots, options.roots_dir, options.rims
    checker = options.ocsp if options.ocsp is not None else OfflineOcspChecker()
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
    options: GpuVerifyOptions = GpuVerifyOptions(),  # frozen: one shared default is safe
) -> list[VerifiedGpu]:
    """Verify every GPU of a multi-GPU bundle with the same nonce; one failure fails the bundle.

    Distinct leaf certificates are required: one GPU answering for all would otherwise pass.
    """
    if not items:
        raise ChainError("empty GPU evidence list")
    rims = options.rims
    out: list[VerifiedGpu] = []
    for i, (ev, chain) in enumerate(items):
        applicable = tuple(_applicable_rims(ev, rims))
        try:
            out.append(verify_gpu_evidence(
                ev, chain, nonce=nonce, now=now, options=dataclasses.replace(options, rims=applicable)
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

