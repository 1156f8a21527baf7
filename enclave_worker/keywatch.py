"""Revocation: the worker polls the key broker and drops the data key and weights when told to.

"revoked" (or a refusal) wipes at once; a network error or a rate limit keeps serving and polls
again, so a broker outage does not take every model down.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from protocol.broker.client import ReleasedKey, check_key_status

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KeyWatch:
    broker_url: str
    released: ReleasedKey
    tenant: str
    model: str
    version: str
    interval_s: float = 30.0

    def check_once(self) -> str:
        with httpx.Client(base_url=self.broker_url, timeout=10.0) as client:
            return check_key_status(client, self.released, tenant=self.tenant, model=self.model,
                                    version=self.version)

    async def run(self, on_revoked: Callable[[], None]) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                status = await asyncio.to_thread(self.check_once)
            except httpx.HTTPError as exc:
                log.warning("key status check failed (%s); still serving", type(exc).__name__)
                continue
            if status == "revoked":
                log.warning("data key revoked by the key broker: wiping the model and refusing requests")
                on_revoked()
                return
