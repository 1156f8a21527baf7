"""Keep the worker's attestation document fresh: re-attest before the broker's token expires.

The broker's tokens live 5 minutes. A client may verify the worker at any time in its life (day
one or day thirty), so the worker renews its token at half its remaining lifetime: fresh evidence
over a new broker nonce, binding the same serving and channel keys (protocol.broker.client.renew_attestation).
A failed renewal is retried soon; the old token stays served until it expires, and then clients
refuse the worker (they never accept an expired token).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import jwt

from enclave_worker.tee import bundle_maker
from protocol.broker.client import renew_attestation
from protocol.broker.errors import BrokerClientError

log = logging.getLogger(__name__)
MIN_INTERVAL_S = 5.0
RETRY_S = 10.0


def renew_in(token: str, now_s: float) -> float:
    """Seconds until the next renewal: half of what is left of the token's life (at least 5 s)."""
    exp = float(jwt.decode(token, options={"verify_signature": False})["exp"])
    return max(MIN_INTERVAL_S, (exp - now_s) / 2)


@dataclass(frozen=True)
class AttestationRenewal:
    state: Any  # enclave_worker.state.WorkerState (not imported: state.py imports this module)
    clock: Callable[[], float] = time.time

    def renew_once(self, make_bundle: Callable[[Any], Any]) -> None:
        state, s = self.state, self.state.settings
        booted = state.booted
        if booted is None:
            return
        with httpx.Client(base_url=s.broker_url, timeout=30.0) as client:
            token, bundle = renew_attestation(client, s.ref,
                                              make_bundle=make_bundle,
                                              hpke_public_key=state.serving_key.public_bytes,
                                              channel_binding=state.channel_binding)
        # Unless revoked meanwhile.
        state.live.renewed(booted, dataclasses.replace(booted, released=dataclasses.replace(
            booted.released, token=token, bundle=bundle)))

    async def run(self) -> None:
        booted = self.state.booted
        if booted is not None and booted.attester is not None:
            make_bundle = booted.attester.bundle  # the boot's: made once per process (boot.py)
        else:
            guard = self.state.guard  # the policy version the boot evidence bound, bound again
            policy_version = guard.policy_set.version if guard and guard.policy_set else 0
            # Once: it measures the code.
            make_bundle = await asyncio.to_thread(bundle_maker, self.state.settings, policy_version)
        while True:
            booted = self.state.booted
            if booted is None:
                return
            await asyncio.sleep(renew_in(booted.released.token, self.clock()))
            try:
                await asyncio.to_thread(self.renew_once, make_bundle)
            except (httpx.HTTPError, BrokerClientError, ValueError) as exc:
                log.warning("attestation renewal failed (%s); retrying in %.0f s", type(exc).__name__, RETRY_S)
                await asyncio.sleep(RETRY_S)
