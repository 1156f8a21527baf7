"""The worker's life after startup, run by its entry point (`enclave_worker/serve.py`), not by any
HTTP app: boot (attest, key release, package load, engine build), then hold the key's lease and keep
the attestation fresh until the key is revoked, the lease runs out or the process stops.

A failed boot (for instance, the key broker refused the key) is reported as "failed" with a fixed
category, never as a hang and never with the exception's text.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

import httpx

from attestation.attesters import Attester
from attestation.errors import AttestationError
from enclave_worker.boot import boot
from enclave_worker.engine.compute_thread import on_a_passing_thread
from enclave_worker.freshness import AttestationRenewal
from enclave_worker.guard import WorkerGuard, build_guard
from enclave_worker.keywatch import KeyLease, LeaseTiming
from enclave_worker.settings import WorkerSettings
from enclave_worker.state import WorkerState
from policy.errors import PolicyError
from protocol.broker.errors import BrokerNotAuthenticated, BrokerRateLimited, BrokerRefused
from protocol.package.errors import PackageError
from protocol.worker_status import BROKER_RATE_LIMITED, BROKER_UNREACHABLE, LEASE_EXPIRED

log = logging.getLogger(__name__)

LOST_REASONS = {  # a fixed category for the heartbeat and /readyz (the broker's audit log has the cause)
    "revoked": "data key revoked by the key broker (or the tenant no longer trusts this worker)",
    "lease-expired": LEASE_EXPIRED,
}


def startup_guard(settings: WorkerSettings) -> tuple[WorkerGuard | None, str]:
    """The tenant's signed policy set, checked before anything else: no key is fetched for a worker
    that could not enforce it. Returns (guard, "") or (None, the failure's category)."""
    s = settings
    try:
        return build_guard(s.policy_file, s.policy_admin_key, s.tenant, s.unsafe_no_tenant_policy,
                           s.min_policy_version), ""
    except Exception as exc:  # logged by type only, like every boot failure
        reason = failure_reason(exc)
        log.error("worker boot failed: %s (%s)", type(exc).__name__, reason)
        return None, reason


async def boot_and_serve(state: WorkerState, attester: Attester | None = None) -> None:
    """Boot, then hold the key's lease for as long as the worker serves (returns when it stops);
    ``attester``: the one a warm worker made while it waited (standby.py), else the boot makes it."""
    s, live = state.settings, state.live
    if live.status != "starting":  # the startup checks failed: nothing to boot
        return
    if state.records.tenant_key is None:
        log.warning("the tenant's policy set names no decision_record_key: the tenant will not see this "
                    "worker's decisions on sealed requests (they are never sent in clear)")
    started = time.monotonic()
    policy_set = state.guard.policy_set if state.guard else None
    try:
        booted = await on_a_passing_thread(
            lambda: boot(s, state.channel_binding, state.serving_key.private_key, policy_set, state.tracing,
                         state.cold_start, attester), "boot")
    except Exception as exc:
        boot_failed(state, exc)
        return
    if not live.ready(booted):  # stopped or failed meanwhile: the model is never served
        booted.wipe()
        return
    # Cold-start figure (docs/deploy.md): attestation + key release + package load + engine build.
    log.info("ready %.1f s after boot started (attest, key release, package load)", time.monotonic() - started)
    # The token clients verify is renewed for the worker's whole life (enclave_worker/freshness.py).
    renewal = asyncio.create_task(AttestationRenewal(state).run())
    live.lease = KeyLease(s.broker_url, booted.released, state.identity(), s.ref,
                          LeaseTiming(lease_s=s.lease_s, watch_s=s.lease_watch_s), clock=state.clock.monotonic)
    try:
        await live.lease.run(lambda reason: revoke(state, reason))
    finally:
        renewal.cancel()


def boot_failed(state: WorkerState, exc: Exception) -> None:
    """Say "failed" with the fault's fixed category (a cold boot's, or a standby worker's wait)."""
    if isinstance(exc, AttestationError):
        # The attester's own words (no secrets: they name interfaces, modes and error codes), one
        # line: "GPU confidential computing is off", "not an SEV-SNP guest", ...
        state.live.fail("attestation failed in the TEE")
        log.error("worker boot failed: %s: %s", type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
        return
    # The reason is logged by type only: it may not carry secrets, but keep it terse.
    state.live.fail(failure_reason(exc))
    log.error("worker boot failed: %s (%s)", type(exc).__name__, state.live.reason)


def failure_reason(exc: BaseException) -> str:
    """A fixed category for /readyz and the control loop; the details stay in the audit logs."""
    if isinstance(exc, BrokerNotAuthenticated):
        return "key broker not authenticated"
    if isinstance(exc, BrokerRefused):
        return "key release refused by the key broker"
    if isinstance(exc, BrokerRateLimited):
        return BROKER_RATE_LIMITED
    if isinstance(exc, PackageError):
        return f"package rejected ({type(exc).__name__})"
    if isinstance(exc, httpx.HTTPError):
        return BROKER_UNREACHABLE
    if isinstance(exc, FileNotFoundError):
        return "package or policy file missing"
    if isinstance(exc, (PolicyError, ValueError)):
        return "tenant policy or package metadata invalid"
    return f"boot failed ({type(exc).__name__})"


def revoke(state: WorkerState, why: str = "") -> None:
    """The key was revoked, the tenant's trust withdrawn or the lease ran out: stop serving and
    wipe every plaintext weight now. The heartbeat then says "failed" (the gateway stops routing)."""
    booted = state.live.fail(LOST_REASONS.get(why, "data key revoked or its lease ran out"))
    lease = state.live.lease
    if lease is not None:
        lease.end()
        # Drop the last references to the data key (bytes: Python cannot zero them in place).
        lease.released = dataclasses.replace(lease.released, data_key=b"")
    if booted is not None:
        booted.wipe()
        asyncio.get_running_loop().create_task(booted.engine.shutdown())


def serving(state: WorkerState) -> bool:
    """Whether requests may run: booted and the key's lease is live. A lease found expired here
    (should the watcher ever lag) wipes at once."""
    if state.live.booted is None:
        return False
    lease = state.live.lease
    if lease is not None and not lease.valid():
        log.error("key lease expired: wiping the model and refusing requests")
        revoke(state)
        return False
    return True
