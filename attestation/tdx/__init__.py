"""Intel TDX: parse (abi) -> verify (signatures, PCK chain, collateral, TCB) -> validate (policy)."""

from attestation.tdx.abi import Quote, parse_quote
from attestation.tdx.validate import Policy, to_claims, validate
from attestation.tdx.verify import (
    Collateral,
    CollateralSource,
    TdxVerifier,
    VerifiedQuote,
    VerifyOptions,
    verify_quote,
)

__all__ = [
    "Collateral",
    "CollateralSource",
    "Policy",
    "Quote",
    "TdxVerifier",
    "VerifiedQuote",
    "VerifyOptions",
    "parse_quote",
    "to_claims",
    "validate",
    "verify_quote",
]
