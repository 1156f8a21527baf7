"""The key lease: the worker keeps its data key only while the key broker renews the lease.

The watcher holds a long poll open at the broker (`POST /v1/lease` with `wait_s`), signed by the
worker's attested identity key and carrying the evidence its token was issued for. The broker
answers at once when the tenant key is revoked (push) or the worker no longer passes the tenant's
current release policy under current collateral (key_broker/lease_appraisal.py), else after the
wait with a renewed lease. On "revoked" the worker wipes at once; when the lease
runs out without a renewal (broker gone too long, network cut, answers forged or dropped), it
wipes too. Any other failure (network, 429, 403, 5xx, a malformed or unauthenticated answer, a
bug) is logged by type and retried with backoff: the watcher never dies while the key is held.

Answers are authenticated by their MAC under a key derived from the data key. That suffices: the
worker authenticated the broker before it took the key (enclave_worker/broker_auth.py: the broker's
evidence, then the token and the receipt under its attested keys), so only the attested broker
knows the data key; an impersonator's answer fails the MAC (`LeaseAnswerInvalid`, logged) and can
only let the lease run out (tests/security/test_operator_attacks_broker.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from protocol.broker.client import ReleasedKey, WorkerIdentity, lease_mac_key, renew_lease
from protocol.model_ref import ModelRef

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseTiming:
    lease_s: float = 60.0  # the longest this worker serves without a renewal (measured)
    watch_s: float = 20.0  # how long one renewal is held open at the broker
    margin_s: float = 5.0  # a held renewal returns this long before the lease would end
    backoff_min_s: float = 0.5
    backoff_max_s: float = 5.0
    request_timeout_s: float = 10.0  # beyond the held wait


@dataclass
class KeyLease:
    """Renews the lease of one released key; `valid()` is what the serving path checks."""

    broker_url: str
    released: ReleasedKey
    identity: WorkerIdentity
    ref: ModelRef
    timing: LeaseTiming = field(default_factory=LeaseTiming)
    clock: Callable[[], float] = time.monotonic  # the worker's Clock.monotonic; a fake one in tests
    # How renewals reach the broker: None is the network; tests give the broker's ASGI app.
    transport: httpx.AsyncBaseTransport | None = None
    expires_at: float = 0.0
    _seq: int = 0

    def __post_init__(self) -> None:
        # The release itself is the first grant.
        self.expires_at = self.clock() + self.timing.lease_s
        # Mutable, so that the end of the lease can zero it (bytes objects cannot be overwritten).
        self._mac_key = bytearray(lease_mac_key(self.released.data_key, self.released.token_id))

    def valid(self) -> bool:
        return self.clock() < self.expires_at

    def end(self) -> None:
        """The lease is over (revoked, refused or run out): nothing of it may extend it again."""
        self.expires_at = float("-inf")
        self._mac_key[:] = bytes(len(self._mac_key))

    async def renew(self, client: httpx.AsyncClient, wait_s: float) -> str:
        """One renewal; extends the lease on "active". Returns the broker's status."""
        self._seq += 1
        sent = self.clock()
        answer = await renew_lease(client, self.released, self.identity, self.ref, seq=self._seq, wait_s=wait_s,
                                   mac_key=bytes(self._mac_key))
        if answer.status == "active":
            # Counted from when the request left: the broker vouched for the key no earlier.
            self.expires_at = max(self.expires_at, sent + min(answer.lease_s, self.timing.lease_s))
        return answer.status

    async def run(self, on_lost: Callable[[str], None]) -> None:
        """Until the key is revoked or the lease runs out; then `on_lost(reason)` once."""
        t = self.timing
        backoff = t.backoff_min_s
        wait_s = 0.0  # renew at once after boot, then hold long polls
        async with httpx.AsyncClient(base_url=self.broker_url, timeout=None, transport=self.transport) as client:
            while True:
                remaining = self.expires_at - self.clock()
                if remaining <= 0:
                    log.error("key lease expired without a renewal: wiping the model and refusing requests")
                    self.end()
                    _call(on_lost, "lease-expired")
                    return
                try:
                    # Bounded by the lease: a hung connection cannot keep the key past its end.
                    status = await asyncio.wait_for(self.renew(client, wait_s),
                                                    timeout=min(remaining, wait_s + t.request_timeout_s))
                except Exception as exc:  # every failure: log its type (never content), retry, lease runs
                    remaining = self.expires_at - self.clock()
                    log.warning("key lease renewal failed (%s); retrying in %.1f s, lease ends in %.0f s",
                                type(exc).__name__, min(backoff, max(remaining, 0)), max(remaining, 0))
                    await asyncio.sleep(max(0.0, min(backoff, remaining)))
                    backoff = min(backoff * 2, t.backoff_max_s)
                    continue
                backoff = t.backoff_min_s
                if status == "revoked":
                    # Revoked, or the tenant's trust withdrawn (the broker's audit log says which).
                    log.warning("data key revoked by the key broker: wiping the model and refusing requests")
                    self.end()
                    _call(on_lost, "revoked")
                    return
                wait_s = max(0.0, min(t.watch_s, self.expires_at - self.clock() - t.margin_s))


def _call(on_lost: Callable[[str], None], reason: str) -> None:
    try:
        on_lost(reason)
    except Exception as exc:  # the wipe itself must not take the loop down silently
        log.error("wiping after %s failed (%s)", reason, type(exc).__name__)
