"""The key broker a client trusts, pinned by what its hardware evidence shows, not by a file of keys.

A worker's evidence is what the client relies on; the broker's token only corroborates it (its
expiry bounds how long a pin lasts). The token's signing keys must still be the genuine broker's:
a JWKS the gateway serves is the operator's word. With a broker pin the client sends a fresh nonce
to the broker's `POST /v1/broker/attestation`, verifies the answer with the same vendor roots it
verifies workers with (attestation/broker_identity.py: REPORT_DATA binds the nonce and the identity
document, debug off, the measurement one the tenant pins), and takes the token JWKS from that
attested document. No key file is pinned, and nothing the operator serves is believed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from attestation.broker_identity import VerifiedBroker, verify_broker_attestation
from attestation.errors import BrokerIdentityError, PolicyViolation
from attestation.verifier import VerifierTrust

_TEES = frozenset({"sim", "snp", "tdx"})


@dataclass(frozen=True)
class BrokerPin:
    """`{"url": "https://broker.example", "tee": ["snp"], "measurements": ["<hex>", ...],
    "workload_ids": ["<hex>", ...]}`.

    ``url``: where the client asks the broker to attest itself (the tenant talks to its broker to
    import keys and sign policies, so it knows it); None: the pin serves `sealed verify --broker`
    only. ``tee``: the TEE types accepted (empty: any the evidence trust accepts). ``measurements``:
    the broker builds accepted (lower-case hex); empty allows none. ``workload_ids``: the digests of
    the broker init-data accepted (SNP HOST_DATA / TDX MRCONFIGID: the broker image, its arguments
    and configuration; attestation/broker_initdata.py); set, one of them is required; empty: not
    checked (the launch digest alone then names only the runtime class's firmware). The simulated
    TEE has no workload id, so a pin with workload ids never accepts a simulated broker."""

    measurements: frozenset[str]
    tee: frozenset[str] = frozenset()
    url: str | None = None
    workload_ids: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not self.measurements:
            raise ValueError("a broker pin names at least one broker measurement")
        if self.tee - _TEES:
            raise ValueError(f"unknown broker TEE types: {sorted(self.tee - _TEES)}")
        if self.workload_ids and "sim" in self.tee:
            raise ValueError("a simulated broker has no workload id: pin workload_ids for snp/tdx brokers only")
        if any(len(w) not in (64, 96) or w.strip("0123456789abcdef") for w in self.workload_ids):
            raise ValueError("broker workload ids are lower-case hex SNP HOST_DATA (64) or TDX MRCONFIGID (96)")
        if self.url is not None and not self.url.startswith(("https://", "http://")):
            raise ValueError("the broker URL must be http(s)")

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> BrokerPin:
        unknown = set(doc) - {"url", "tee", "measurements", "workload_ids"}
        if unknown:
            raise PolicyViolation([f"unknown broker keys: {sorted(unknown)}"])
        tee = doc.get("tee") or []
        tees = [tee] if isinstance(tee, str) else list(tee)
        try:
            return cls(measurements=frozenset(str(m).lower() for m in doc.get("measurements") or []),
                       tee=frozenset(str(t) for t in tees), url=str(doc["url"]) if doc.get("url") else None,
                       workload_ids=frozenset(str(w).lower() for w in doc.get("workload_ids") or []))
        except ValueError as exc:
            raise PolicyViolation([f"broker pin: {exc}"]) from exc

    @property
    def attestation_url(self) -> str:
        if self.url is None:
            raise BrokerIdentityError("the broker pin names no URL to ask the broker for its attestation")
        return self.url.rstrip("/") + "/v1/broker/attestation"


def attested_broker_jwks(pin: BrokerPin, answer: Mapping[str, Any], *, nonce: bytes, issuer: str,
                         trust: VerifierTrust, now: dt.datetime) -> Mapping[str, Any]:
    """The token JWKS of the broker whose evidence verifies under `pin`; else an AttestationError."""
    verified: VerifiedBroker = verify_broker_attestation(answer, nonce=nonce, now=now, trust=trust,
                                                         allowed_measurements=pin.measurements,
                                                         allowed_workload_ids=pin.workload_ids)
    if pin.tee and verified.cpu.tee.value not in pin.tee:
        raise BrokerIdentityError(f"the key broker runs on {verified.cpu.tee.value}, not on a pinned TEE")
    if verified.identity.issuer != issuer:
        raise BrokerIdentityError(f"the attested broker issues tokens as {verified.identity.issuer!r}, "
                                  f"not {issuer!r}")
    return verified.identity.token_jwks
