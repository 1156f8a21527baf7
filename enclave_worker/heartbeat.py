"""The worker's heartbeats: how a gateway learns of it, its state and its attestation.

The gateway fetches nothing from a worker; each beat carries what the gateway serves on
`/.well-known/attestation`, signed by the worker's attested identity (usage) key, in order. A beat
also carries a batch of what calls that ended early still owe (`outbox.py`: usage records, the
tenant's sealed decision records), under the same signature; it is dropped from the outbox once a
gateway answers that it stored it (`"settled": true`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

import httpx

from enclave_worker.outbox import OutboxBatch
from enclave_worker.release_statement import release_statement
from enclave_worker.state import WorkerState
from policy.audit.worker_record import public_key_bytes
from protocol.heartbeat import heartbeat_signing_input, worker_id_for
from protocol.worker_status import Heartbeat

HEARTBEAT_INTERVAL_S = 1.0


def heartbeat_body(state: WorkerState, grpc_address: str, tls_cert: str, seq: int,
                   batch: OutboxBatch | None = None) -> dict[str, Any]:
    """One heartbeat, signed by the worker's attested identity (usage) key."""
    s, booted = state.settings, state.booted
    public = public_key_bytes(state.usage_key)
    attestation = None
    if booted is not None:
        attestation = {"tee": s.tee, "insecure": s.insecure, "evidence": booted.released.bundle.to_json(),
                       "token": booted.released.token, "model_digest": booted.model_digest,
                       "sealed_key_id": state.serving_key.key_id, "promises": state.promises(),
                       "release": release_statement(state)}
    body: dict[str, Any] = {
        **state.report().model_dump(mode="json"), "worker_id": worker_id_for(public), "grpc_address": grpc_address,
        "usage_public_key": public.hex(), "pid": os.getpid(), "tls_cert": tls_cert,
        "sealed_key_id": state.serving_key.key_id, "attestation": attestation, "seq": seq,
        "at": int(state.clock.now())}
    owed = batch.to_json() if batch is not None else None
    if owed is not None:
        body["settle"] = owed
    body["signature"] = state.usage_key.sign(heartbeat_signing_input(body)).hex()
    Heartbeat.model_validate(body)  # the message the gateway takes, or an error here
    return body


async def heartbeats(state: WorkerState, urls: list[str], token: str, grpc_address: str,
                     interval: float = HEARTBEAT_INTERVAL_S, tls_cert: str = "") -> None:
    """Beat every `interval` seconds, and at once whenever the worker's state changes (`LiveState.changed`):
    a worker that becomes ready is routable as soon as the gateway has checked the evidence this beat
    carries (the same check as on any beat), not up to an interval later."""
    seq = 0
    async with httpx.AsyncClient(timeout=2.0) as client:
        while True:
            seq += 1
            state.live.changed.clear()  # before the body is read: a change from here on makes another beat
            batch = state.outbox.batch()
            body = heartbeat_body(state, grpc_address, tls_cert, seq, batch)
            settled = False
            for url in urls:
                # The gateway may not be up yet, or restarting: keep beating.
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    reply = await client.post(f"{url}/internal/workers/heartbeat", json=body,
                                              headers={"Authorization": f"Bearer {token}"})
                    settled = settled or (reply.status_code == 200 and reply.json().get("settled") is True)
                    if reply.status_code == 200 and body["status"] == "ready":
                        state.cold_start.announced()  # the gateway checked this beat's attestation
            if settled:
                state.outbox.settled(batch)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.live.changed.wait(), interval)
