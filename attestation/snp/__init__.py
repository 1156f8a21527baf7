"""AMD SEV-SNP: parse (abi) -> verify (chain, CRL, TCB binding, signature) -> validate (policy) -> claims."""

from attestation.snp.abi import Report, encode_report, parse_report
from attestation.snp.certs import VekInfo, VekKind, parse_vek
from attestation.snp.claims import to_claims
from attestation.snp.tcb import Product, TcbVersion
from attestation.snp.validate import Policy, validate
from attestation.snp.verify import CollateralFetcher, VerifiedChain, VerifiedReport, verify_report

__all__ = [
    "CollateralFetcher",
    "Policy",
    "Product",
    "Report",
    "TcbVersion",
    "VekInfo",
    "VekKind",
    "VerifiedChain",
    "VerifiedReport",
    "encode_report",
    "parse_report",
    "parse_vek",
    "to_claims",
    "validate",
    "verify_report",
]
