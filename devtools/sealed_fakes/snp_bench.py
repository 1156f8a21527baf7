"""Helpers for `sealed bench attest`: SNP verification with the VEK chain verified once and cached.

    verify = make_cached_verifier(vek_der, now=now, roots_dir=roots)   # chain checked here, once
    verify(report_bytes)   # per call: strict parse + binding checks + one ECDSA P-384 verify

`synthetic_case()` needs no test vectors: it builds a test PKI and one signed report.
"""

from __future__ import annotations

import datetime as dt
import tempfile
from collections.abc import Callable
from pathlib import Path

from cryptography import x509

from attestation.snp.abi import parse_report
from attestation.snp.certs import parse_vek
from attestation.snp.tcb import Product
from attestation.snp.verify import VerifiedReport, verify_vek_chain, verify_with_chain


def make_cached_verifier(
    vek: bytes | x509.Certificate,
    *,
    now: dt.datetime,
    roots_dir: Path | None = None,
    crls: tuple[bytes, ...] = (),
    product: Product | None = None,
) -> Callable[[bytes], VerifiedReport]:
    """Verify the VEK chain (and CRLs) at `now` once; return a per-report verifier reusing it."""
    chain = verify_vek_chain(parse_vek(vek), now=now, roots_dir=roots_dir, crls=crls)

    def verify(report: bytes) -> VerifiedReport:
        return verify_with_chain(parse_report(report), chain, product)

    return verify


def synthetic_case(rsa_bits: int = 4096) -> tuple[Callable[[bytes], VerifiedReport], bytes]:
    """(cached verifier, signed v3 Milan report) under a freshly generated test PKI."""
    from sealed_fakes import snp_pki as testing  # test-only PKI; imported lazily so production never needs it

    keys = testing.generate_keys(rsa_bits)
    pki = testing.make_pki(keys, Product.MILAN)
    roots = pki.write_roots(Path(tempfile.mkdtemp(prefix="sealed-snp-bench-")))
    report = testing.template_report(3, Product.MILAN)
    vek = pki.make_vek(report.tcb("reported", Product.MILAN), report.chip_id)
    now = testing.EPOCH + dt.timedelta(days=30)
    return make_cached_verifier(vek, now=now, roots_dir=roots), testing.sign_report(report, keys.vek)
