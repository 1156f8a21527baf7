"""A lease follows the tenant's trust: each renewal appraises the worker's evidence again.

A released key is not a one-off decision. On every renewal (and, while a renewal is held open,
whenever key state may have changed and at least every `reappraise_s`), the broker verifies the
evidence the worker's token was issued for once more, as of now and under the collateral it holds
now (an imported CRL that revokes the chip's VCEK, a TCB info update), and decides again under the
tenant's CURRENT release policy (`KeyBrokerService.appraise`, the same code the first release ran).
If that no longer passes, the lease answer is "revoked" (MACed, so the worker wipes its key at
once); the reason goes to the broker's audit log only (action "lease", decision "deny").

The evidence comes with the renewal: the worker sends the bundle its token was issued for. It is
not trusted: its digest must be the token's `evidence_digest` (the broker signed that token) and it
is verified in full against the token's nonce (`eat_nonce`), so only the evidence appraised at
release can be appraised again, and a broker that restarted needs no state of its own for it.
"""

from __future__ import annotations

import datetime as dt
import threading
from dataclasses import dataclass, field
from typing import Any

from attestation.bundle import EvidenceBundle
from attestation.errors import AttestationError
from attestation.token import AttestationClaims
from key_broker.errors import KeyBrokerError, ReleaseRefused
from key_broker.service import KeyBrokerService, _reason
from policy.errors import PolicyError
from protocol.model_ref import ModelRef


def lease_evidence(body: dict[str, Any], claims: AttestationClaims) -> tuple[EvidenceBundle, bytes]:
    """The renewal's evidence, if it is exactly what the token was issued for, and that token's nonce."""
    doc = body.get("evidence")
    if doc is None:
        raise ReleaseRefused("lease request carries no evidence (it is appraised again at each renewal)")
    bundle = EvidenceBundle.from_json(doc)  # ParseError (an AttestationError) when malformed
    if not claims.evidence_digest or bundle.digest() != claims.evidence_digest:
        raise ReleaseRefused("lease request evidence is not the evidence its token was issued for")
    nonce = bytes.fromhex(str(claims.raw.get("eat_nonce", "")))
    return bundle, nonce


@dataclass
class Reappraisal:
    """The re-appraisal state of one held renewal: when it last ran and what it found."""

    ref: ModelRef
    bundle: EvidenceBundle
    nonce: bytes
    token_id: str
    checked_at: dt.datetime | None = None
    generation: int = -1  # the ChangeNotifier generation it last ran under
    refused: bool = False  # sticky: trust withdrawn once is not regained by this lease
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def due(self, now: dt.datetime, generation: int, every: dt.timedelta) -> bool:
        return (self.checked_at is None or generation != self.generation
                or now - self.checked_at >= every)


def still_trusted(service: KeyBrokerService, state: Reappraisal, generation: int,
                  every: dt.timedelta) -> bool:
    """Whether the tenant still trusts the worker behind this lease; a refusal is audited once."""
    with state._lock:  # one held poll re-checks at a time (its own thread pool calls may overlap)
        if state.refused:
            return False
        now = service.clock()
        if not state.due(now, generation, every):
            return True
        ref = state.ref
        meta: dict[str, Any] = {"model": ref.model, "version": ref.version, "token_id": state.token_id,
                                "evidence_digest": state.bundle.digest(), "tee": state.bundle.tee,
                                "reappraisal": True}
        try:
            service.appraise(state.bundle, state.nonce, ref, now, meta)
        except (AttestationError, KeyBrokerError, PolicyError, ValueError) as exc:
            state.refused = True
            service._deny(ref.tenant, "lease", f"re-appraisal: {_reason(exc)}"[:512], meta)
            return False
        state.checked_at, state.generation = now, generation
        return True
