"""Timing support for `sealed bench attest`: TDX quote verification with warm chain/collateral caches.

Each timed call parses the quote and checks the QE report signature, the attestation key binding,
the quote signature and the TCB evaluation; the PCK chain, CRLs and collateral signatures are
served from the verifier's cache (content-hash keyed, re-checked against `now`'s window).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from attestation import x509chain
from attestation.tdx.verify import INTEL_ROOT_FILE, Collateral, TdxVerifier, VerifiedQuote
from sealed_fakes import tdx_collateral as testcollateral
from sealed_fakes import tdx_pki as testpki


@dataclass(frozen=True)
class TdxBenchCase:
    name: str
    quote: bytes
    now: dt.datetime
    collateral: Collateral
    roots: tuple[x509.Certificate, ...]


def synthetic_case() -> TdxBenchCase:
    """A v5 (TDX 1.5 body) quote under a throwaway test PKI; needs no test vectors."""
    pki = testpki.make_pki()
    quote = testpki.build_quote(pki, version=5, body_type=3, tee_tcb_svn=bytes([6, 1, 4]) + bytes(13))
    return TdxBenchCase("tdx-synthetic-v5", quote, testpki.NOW, testcollateral.collateral(pki), (pki.root,))


def vector_case(testvectors: Path) -> TdxBenchCase:
    """Real trustee quote_4 with go-tdx-guest's Intel PCS collateral at 2023-07-01 (UpToDate, CRLs on)."""
    tdx = testvectors / "tdx"
    collateral = Collateral(
        tcb_info=(tdx / "gotdxguest_sample_tcbInfo_response").read_bytes(),
        qe_identity=(tdx / "gotdxguest_sample_qeIdentity_response").read_bytes(),
        signing_chain=(tdx / "gotdxguest_tcbInfoIssuerChain.pem").read_bytes(),
        pck_crl=(tdx / "gotdxguest_pckcrl").read_bytes(),
        root_crl=(tdx / "gotdxguest_rootcrl.der").read_bytes(),
    )
    roots = tuple(x509chain.load_pinned_roots(INTEL_ROOT_FILE))
    now = dt.datetime(2023, 7, 1, 1, tzinfo=dt.UTC)
    return TdxBenchCase(
        "tdx-trustee-quote4", (tdx / "trustee_tdx_quote_4.dat").read_bytes(), now, collateral, roots
    )


def prepare(case: TdxBenchCase) -> Callable[[], VerifiedQuote]:
    """A zero-argument verification call with caches warmed by one untimed run."""
    verifier = TdxVerifier(case.roots)

    def run() -> VerifiedQuote:
        return verifier.verify(case.quote, case.now, case.collateral)

    run()
    return run
