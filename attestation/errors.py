"""One error tree for the attestation package. Checks raise; they never return a bool."""

from __future__ import annotations


class AttestationError(Exception):
    """Base of every attestation failure."""


class ParseError(AttestationError):
    """Evidence or collateral is malformed: wrong length, bad offsets, must-be-zero bytes set."""


class SignatureError(AttestationError):
    """A signature over evidence, collateral or a token does not verify."""


class ChainError(AttestationError):
    """A certificate chain does not lead to a pinned root, or a certificate is invalid at `now`."""


class RevokedError(ChainError):
    """A certificate in the chain is listed in a CRL or reported revoked by OCSP."""


class CollateralError(AttestationError):
    """Collateral (tcbInfo, qeIdentity, CRL, VCEK, RIM) is missing, stale, or does not match."""


class FreshnessError(AttestationError):
    """The nonce or REPORT_DATA binding does not match what the relying party expected."""


class TokenError(AttestationError):
    """An attestation result token is malformed, expired, or not signed by a trusted verifier."""


class UnsupportedError(AttestationError):
    """The evidence kind or version is not supported, or the hardware to collect it is absent."""


class PolicyViolation(AttestationError):
    """Claims violate an appraisal policy. Every violation is reported together."""

    def __init__(self, violations: list[str]) -> None:
        self.violations = list(violations)
        super().__init__("; ".join(self.violations) or "policy violation")


class UnboundClaim(PolicyViolation):
    """A claim served beside the evidence (promises, tenant, model, version, model digest) differs from
    the one the evidence binds: edited on the way. The client relies only on what the hardware signed,
    and refuses a document that says otherwise next to it."""


class WorkloadMismatch(AttestationError):
    """What a worker runs (arguments, environment, configuration, policy floor) is not what its
    init-data says, or its hardware does not carry that init-data's digest: it must not start."""


class SealingError(AttestationError):
    """State sealed to a measurement does not open here: another measurement, another platform, or
    edited bytes; or this TEE offers no sealing key."""


class BrokerIdentityError(AttestationError):
    """The key broker's evidence verifies, but it is not a broker this relying party trusts: another
    measurement, a debug or simulated TEE it does not accept, or an identity document it does not bind."""
