"""Test-only NVIDIA collateral for the fake platform: signed RIMs and signed OCSP answers, as an
operator would download them from NVIDIA's RIM service and OCSP responder and import them offline.

The fake GPUs (`platform.gpu_report`) measure `MEASUREMENTS` unless told otherwise; the RIMs hold
exactly those values, split between a VBIOS RIM (RIM indices 0..31) and a driver RIM (32..63) for
the versions the fake reports. Every certificate below each root (the GPUs' device chains and the
RIM signing chain) gets an OCSP answer signed by its issuer: "good", or "revoked" for the GPUs
named in `revoked_gpus`.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509 import ocsp

from attestation.nvgpu.abi import SHA384_LEN
from sealed_fakes import nvgpu_pki as gpu_pki

MEASUREMENTS = {i: bytes([i]) * SHA384_LEN for i in range(1, 65)}  # gpu_pki.EvidenceSpec's default
DRIVER = gpu_pki.EvidenceSpec(nonce=bytes(32)).driver
VBIOS = "96.00.9F.00.01"  # gpu_pki.EvidenceSpec.vbios_raw as the report formats it


def tampered_measurements(block: int = 10) -> dict[int, bytes]:
    """A GPU whose firmware measured something else at one VBIOS block (not what NVIDIA signed)."""
    return {**MEASUREMENTS, block: b"\xee" * SHA384_LEN}


def ocsp_answer(cert: x509.Certificate, issuer: x509.Certificate, issuer_key: ec.EllipticCurvePrivateKey, *,
                revoked: bool, this_update: dt.datetime, next_update: dt.datetime) -> bytes:
    """A DER OCSPResponse for `cert`, signed by its issuer (RFC 6960, the responder is the CA)."""
    builder = ocsp.OCSPResponseBuilder().add_response(
        cert=cert, issuer=issuer, algorithm=hashes.SHA384(),
        cert_status=ocsp.OCSPCertStatus.REVOKED if revoked else ocsp.OCSPCertStatus.GOOD,
        this_update=this_update, next_update=next_update,
        revocation_time=this_update if revoked else None,
        revocation_reason=x509.ReasonFlags.key_compromise if revoked else None,
    ).responder_id(ocsp.OCSPResponderEncoding.HASH, issuer)
    return builder.sign(issuer_key, hashes.SHA384()).public_bytes(serialization.Encoding.DER)


def _chain_answers(chain: Sequence[x509.Certificate], keys: Sequence[ec.EllipticCurvePrivateKey], *,
                   revoked_leaf: bool, this_update: dt.datetime, next_update: dt.datetime) -> list[bytes]:
    out = []
    for i, (cert, issuer) in enumerate(itertools.pairwise(chain)):
        out.append(ocsp_answer(cert, issuer, keys[i + 1], revoked=revoked_leaf and i == 0,
                               this_update=this_update, next_update=next_update))
    return out


def write_gpu_bundle(rim: Any, gpus: Sequence[Any], bundle: Path, now: dt.datetime, *,
                     revoked_gpus: Collection[int] = (), days: int = 7) -> list[Path]:
    """The RIMs and OCSP answers into `bundle/nvidia/` (for `CollateralStore.import_dir`): `rim` and
    `gpus` are a FakePlatform's fake RIM service and GPUs (its `write_collateral` calls this)."""
    if rim is None:
        raise ValueError("the platform has no fake RIM service")
    out = bundle / "nvidia"
    out.mkdir(parents=True, exist_ok=True)
    signer = rim
    vbios = {i: (MEASUREMENTS[i + 1],) for i in range(32)}
    driver = {i: (MEASUREMENTS[i + 1],) for i in range(32, 64)}
    written = []
    for name, version, golden in (("vbios", VBIOS, vbios), ("driver", DRIVER, driver)):
        path = out / f"rim-{name}.xml"
        path.write_bytes(gpu_pki.sign_rim(gpu_pki.rim_xml(version, golden), signer.chain, signer.keys[0]))
        written.append(path)
    issue, until = now - dt.timedelta(hours=1), now + dt.timedelta(days=days)
    answers = _chain_answers(signer.chain, signer.keys, revoked_leaf=False, this_update=issue, next_update=until)
    for index, gpu in enumerate(gpus):
        answers += _chain_answers(gpu.chain, gpu.chain_keys, revoked_leaf=index in revoked_gpus,
                                  this_update=issue, next_update=until)
    for n, answer in enumerate(answers):
        path = out / f"ocsp-{n:02d}.der"
        path.write_bytes(answer)
        written.append(path)
    return written
