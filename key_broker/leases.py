"""Key leases: a released data key stays usable only while its worker renews the lease.

A renewal is signed by the worker's attested identity key: the key whose hash (with the worker's
TLS key) is the channel binding in REPORT_DATA, hence in the broker's token. The public token
alone (it is served on /.well-known/attestation) cannot renew, so a flood made with it is refused
before it reaches the worker's rate-limit bucket, which is keyed by that authenticated identity.

A renewal may wait (long poll): the broker holds it and answers as soon as the tenant key is
revoked or the data key removed (pushed by the admin API through `ChangeNotifier`, and re-checked
every `recheck_s` for changes made elsewhere), else after the wait with a renewed lease. Each
renewal also appraises the worker's evidence again under the tenant's current release policy and
the collateral held now (key_broker/lease_appraisal.py): at its start, on every change pushed, and
every `reappraise_s` while held; a worker the tenant no longer trusts is answered "revoked".
Answers carry a MAC under a key derived from the data key, so only this broker can extend a lease.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from attestation.bundle import channel_binding
from attestation.errors import AttestationError
from key_broker.errors import KeyBrokerError, RateLimited, ReleaseRefused
from key_broker.lease_appraisal import Reappraisal, lease_evidence, still_trusted
from key_broker.service import KeyBrokerService, _reason
from protocol.broker.client import lease_answer_mac, lease_mac_key, lease_request_payload
from protocol.model_ref import ModelRef


@dataclass(frozen=True)
class LeaseSettings:
    lease_s: int = 60  # how long one renewal keeps a key usable (the worker caps it with its own)
    max_wait_s: float = 30.0  # longest long poll the broker holds
    recheck_s: float = 1.0  # a held poll re-reads revocation state this often (changes made elsewhere)
    max_clock_skew_s: int = 300  # a signed request's time must be this close to the broker's
    # A held renewal appraises the worker's evidence again at least this often (a CRL or TCB info
    # imported by another process is seen within it; changes made through the API at once).
    reappraise_s: float = 10.0


@dataclass(frozen=True)
class LeaseGrant:
    ref: ModelRef
    token_id: str
    seq: int
    wait_s: float
    mac_key: bytes
    reappraisal: Reappraisal


class ChangeNotifier:
    """Wakes every held long poll (in any event loop) when key state may have changed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self.generation = 0  # counts notifications: a held renewal re-appraises when it moved

    def notify(self) -> None:
        with self._lock:
            self.generation += 1
            waiters = list(self._waiters)
        for loop, event in waiters:
            loop.call_soon_threadsafe(event.set)

    async def wait(self, timeout: float) -> None:
        waiter = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._waiters.add(waiter)
        try:
            await asyncio.wait_for(waiter[1].wait(), timeout)
        except TimeoutError:
            pass
        finally:
            with self._lock:
                self._waiters.discard(waiter)


class LeaseBook:
    def __init__(self, service: KeyBrokerService, settings: LeaseSettings | None = None) -> None:
        self.service = service
        self.settings = settings or LeaseSettings()
        self.changes = ChangeNotifier()
        self._lock = threading.Lock()
        self._last_seq: dict[str, int] = {}  # token id -> highest renewal seq seen (replay guard)
        self._mac_keys: dict[str, bytes] = {}  # token id -> answer MAC key

    def authenticate(self, body: dict[str, Any]) -> LeaseGrant:
        """Token (signature and scope) -> identity key bound by it -> signature -> freshness ->
        rate limit per identity -> the token's evidence. Every refusal is audited and leaves as
        ReleaseRefused."""
        svc = self.service
        tenant = body["tenant"]
        meta: dict[str, Any] = {"model": body["model"], "version": body["version"]}
        try:
            ref = ModelRef(tenant, body["model"], body["version"])
            # 1. The broker's token, checked "as of" its own issue time (a lease outlives it).
            claims = svc._verifier.verify_as_issued(str(body["token"]))
            svc._scoped_claims(claims, ref, meta)
            # 2. The identity key is the one the attestation binds (not merely any key).
            bound = claims.channel_binding
            identity = bytes.fromhex(body["identity_key"])
            if not bound or bound != channel_binding(bytes.fromhex(body["tls_spki"]), identity).hex():
                raise ReleaseRefused("lease request key is not the one the attestation binds")
            # 3. Signed by it.
            Ed25519PublicKey.from_public_bytes(identity).verify(
                bytes.fromhex(body["signature"]), lease_request_payload(body, claims.token_id))
            # 4. Fresh and not replayed.
            if abs(svc.clock().timestamp() - int(body["at"])) > self.settings.max_clock_skew_s:
                raise ReleaseRefused("lease request time is too far from the broker's")
            jti = claims.token_id
            with self._lock:
                if int(body["seq"]) <= self._last_seq.get(jti, 0):
                    raise ReleaseRefused("lease request replayed (sequence number not increasing)")
                if len(self._last_seq) > 100_000:
                    self._last_seq.clear()
                self._last_seq[jti] = int(body["seq"])
            # 5. Rate limit by the authenticated worker, never by something public.
            svc._limiter.check("lease", bound)
            # 6. The evidence the token was issued for, to appraise again (status()).
            bundle, nonce = lease_evidence(body, claims)
            mac_key = self._mac_key(jti, ref)
        except RateLimited:
            raise
        except (AttestationError, jwt.PyJWTError, KeyBrokerError, InvalidSignature, KeyError, TypeError,
                ValueError) as exc:
            raise svc._deny(tenant, "lease", _reason(exc), meta) from exc
        return LeaseGrant(ref, jti, int(body["seq"]),
                          min(max(float(body["wait_s"]), 0.0), self.settings.max_wait_s), mac_key,
                          Reappraisal(ref, bundle, nonce, jti))

    def _mac_key(self, jti: str, ref: ModelRef) -> bytes:
        with self._lock:
            key = self._mac_keys.get(jti)
        if key is None:
            # Cached from the first renewal on; after a restart the data key is unwrapped again
            # (which a revoked tenant key refuses: that worker then learns it at lease expiry).
            data_key, _ = self.service.datakeys.data_key(ref)
            key = lease_mac_key(data_key, jti)
            with self._lock:
                if len(self._mac_keys) > 100_000:
                    self._mac_keys.clear()
                self._mac_keys[jti] = key
        return key

    def status(self, grant: LeaseGrant) -> str:
        svc = self.service
        try:
            revoked = svc.keystore.is_revoked(grant.ref.tenant) or not svc.datakeys.exists(grant.ref)
        except KeyBrokerError:
            revoked = True
        if revoked:
            return "revoked"
        every = dt.timedelta(seconds=self.settings.reappraise_s)
        trusted = still_trusted(svc, grant.reappraisal, self.changes.generation, every)
        return "active" if trusted else "revoked"

    def answer(self, grant: LeaseGrant, status: str) -> dict[str, Any]:
        answer: dict[str, Any] = {"token_id": grant.token_id, "seq": grant.seq, "status": status,
                                  "lease_s": self.settings.lease_s if status == "active" else 0}
        answer["mac"] = lease_answer_mac(grant.mac_key, answer)
        return answer
