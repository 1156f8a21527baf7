"""A warm worker: booted and attested, waiting without a key for an assignment (docs/deploy.md, "Warm pools").

Started with ``--standby``, the worker does everything a start can do without the model's key: the
process, its imports and the engine's kernels; the tenant's signed policy; the GPU confidentiality
check; the key broker's own attestation (where pinned); its evidence, appraised by the broker (a token,
no key: the broker's ``/v1/attest``, as renewals use it); and the package's fit from its signed manifest.
It then says ``standby`` and waits. ``POST /internal/assign`` starts the ordinary boot (boot.py): fresh
evidence under a fresh nonce, the key, decryption, the engine. Nothing a standby worker did stands in
for that attestation: the key is released only to the evidence made at assignment.

The assignment carries nothing: whoever can reach the internal port (the operator) could as well start
a cold worker. The control loop keeps a number of these per version (api/orchestrator/loop.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from fastapi import APIRouter
from fastapi.responses import JSONResponse

from attestation.attesters import Attester
from enclave_worker.boot import broker_unauthenticated
from enclave_worker.broker_auth import authenticate_broker
from enclave_worker.engine.compute_thread import on_a_passing_thread
from enclave_worker.gpu import check_gpu_confidentiality
from enclave_worker.memory_fit import check_package_fits
from enclave_worker.settings import WorkerSettings
from enclave_worker.state import WorkerState
from enclave_worker.tee import make_attester
from policy.policyset import PolicySet
from protocol.broker.client import renew_attestation
from protocol.broker.sealing import raw_public_key

log = logging.getLogger(__name__)


def attest_without_key(settings: WorkerSettings, channel_binding: bytes, hpke_key: X25519PrivateKey,
                       policy_set: PolicySet | None) -> Attester:
    """Every check of a start that needs no key; raises what boot() would raise for the same fault.
    Returns the attester, which the boot at assignment makes its fresh evidence with."""
    check_gpu_confidentiality(settings, policy_set)
    attester = make_attester(settings, policy_set.version if policy_set else 0)
    with httpx.Client(base_url=settings.broker_url, timeout=30.0) as client:
        if not broker_unauthenticated(settings):
            authenticate_broker(settings, client)
        renew_attestation(client, settings.ref, make_bundle=attester.bundle,
                          hpke_public_key=raw_public_key(hpke_key), channel_binding=channel_binding)
    check_package_fits(settings, None)
    return attester


@dataclass
class Standby:
    """The gate between a standby worker's attested wait and its boot."""

    assigned: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, state: WorkerState, boot: Callable[[WorkerState, Attester], Awaitable[None]],
                  failed: Callable[[WorkerState, Exception], None]) -> None:
        """Attest without a key and wait; on assignment, ``boot`` (lifecycle.boot_and_serve) with the
        attester made here; ``failed`` reports a fault. The tenant's policy was checked at startup
        (state.guard); a worker whose startup checks failed waits for nothing."""
        s = state.settings
        if state.live.status != "starting":
            return
        try:
            policy_set = state.guard.policy_set if state.guard else None
            attester = await on_a_passing_thread(lambda: attest_without_key(
                s, state.channel_binding, state.serving_key.private_key, policy_set), "standby")
        except Exception as exc:
            failed(state, exc)
            state.cold_start.end(error=type(exc).__name__)
            return
        state.cold_start.mark("boot", state.cold_start.started)
        if not state.live.standby():  # stopped meanwhile
            return
        log.info("standby: attested, waiting for an assignment (no key asked for)")
        await self.assigned.wait()
        if state.live.assign():
            await boot(state, attester)

    def router(self, state: WorkerState) -> APIRouter:
        router = APIRouter()

        @router.post("/internal/assign")
        async def assign() -> JSONResponse:
            """Start the boot of a standby worker; 409 for any other (a second assignment included).
            On the worker's event loop, where ``run`` waits: an asyncio.Event set from a pool thread
            (a plain ``def`` route) would wake it only at the loop's next unrelated wake-up."""
            if state.live.status != "standby" or self.assigned.is_set():
                return JSONResponse(status_code=409, content={"error": {
                    "message": f"this worker is {state.live.status}, not standby", "type": "conflict"}})
            state.cold_start.assigned()
            self.assigned.set()
            return JSONResponse(status_code=202, content={"status": "starting"})

        return router
