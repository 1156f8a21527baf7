"""The worker process's entry point once its settings are parsed: make the in-memory keys, check the
tenant's policy, build the `WorkerState`, open the gRPC service (over mutual TLS when a gateway
certificate is pinned), the status app and the heartbeats, boot (`lifecycle.py`), and on SIGTERM or
SIGINT drain and stop, all in one event loop.

The status app and the heartbeats are up while the worker boots, so the gateway sees "starting" and
"failed" as they happen; requests are served only once the boot has put the model in `state.live`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Iterator

import grpc
import uvicorn
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from enclave_worker.heartbeat import HEARTBEAT_INTERVAL_S, heartbeats
from enclave_worker.lifecycle import boot_and_serve, boot_failed, startup_guard
from enclave_worker.server import create_app
from enclave_worker.servicer import WorkerServicer
from enclave_worker.settings import WorkerSettings
from enclave_worker.standby import Standby
from enclave_worker.state import LiveState, WorkerState
from protocol.rpc import worker_pb2_grpc
from protocol.tls import make_identity
from protocol.tracing import tracing_from_env

log = logging.getLogger(__name__)


def _listen(server: grpc.aio.Server, address: str, gateway_client_cert: bytes | None) -> tuple[str, bytes]:
    """Open the gRPC port; with a pinned gateway certificate, mutual TLS under a key made now and
    kept in memory. Returns the certificate (PEM) and its DER public key, or ("", b"")."""
    if not gateway_client_cert:
        server.add_insecure_port(address)
        return "", b""
    identity = make_identity()
    server.add_secure_port(address, grpc.ssl_server_credentials(
        [(identity.key_pem, identity.cert_pem)], root_certificates=gateway_client_cert, require_client_auth=True))
    spki = x509.load_pem_x509_certificate(identity.cert_pem).public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return identity.cert_pem.decode(), spki


class _StatusServer(uvicorn.Server):
    """uvicorn for the status app, leaving SIGTERM and SIGINT to `serve` (which drains first)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve(settings: WorkerSettings, grpc_port: int, register_urls: list[str], register_token: str,
                gateway_client_cert: bytes | None = None, advertise_host: str | None = None) -> None:
    # No SO_REUSEPORT (gRPC's default on Linux): a second process binding this port must fail, not
    # take a share of the gateway's connections.
    server = grpc.aio.server(options=[("grpc.max_concurrent_streams", 4096),
                                      ("grpc.max_receive_message_length", 32 << 20), ("grpc.so_reuseport", 0)])
    # Before the state: the evidence the key broker sees commits to exactly this channel key.
    tls_cert, spki = _listen(server, f"{settings.host}:{grpc_port}", gateway_client_cert)
    guard, failure = startup_guard(settings)
    state = WorkerState(settings, guard=guard, tls_spki=spki, tracing=tracing_from_env("worker"),
                        live=LiveState(status="failed", reason=failure) if failure else LiveState())
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkerServicer(state), server)  # type: ignore[no-untyped-call]
    await server.start()
    # Bound to all interfaces in a pod: the gateway is told the pod's own address.
    public = advertise_host or settings.host
    beat = asyncio.create_task(heartbeats(state, register_urls, register_token, f"{public}:{grpc_port}",
                                          tls_cert=tls_cert)) if register_urls else None
    standby = Standby() if settings.standby else None  # a warm worker waits for its assignment first
    http = _StatusServer(uvicorn.Config(create_app(state, standby), host=settings.host, port=settings.port,
                                        log_level="warning", access_log=False, lifespan="off"))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    http_task = asyncio.create_task(http.serve())
    life = asyncio.create_task(boot_and_serve(state) if standby is None
                               else standby.run(state, boot_and_serve, boot_failed))
    stopping = asyncio.create_task(stop.wait())
    try:
        # Until asked to stop (or the status app could not serve, e.g. its port is taken).
        await asyncio.wait({stopping, http_task}, return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set():
            await _drain(state, server, bool(register_urls))
    finally:
        stopping.cancel()
        life.cancel()
        http.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(life, http_task, return_exceptions=True)
        if beat is not None:
            beat.cancel()
        await server.stop(grace=1.0)
        booted = state.live.booted
        if booted is not None:
            await booted.engine.shutdown()
        state.tracing.shutdown()


async def _drain(state: WorkerState, server: grpc.aio.Server, heartbeating: bool) -> None:
    """Scale-in and rollouts end a worker with SIGTERM: say "draining" (the gateway stops routing
    here), then let gRPC finish the streams in flight, bounded by `drain_s`, before the engine stops."""
    if state.live.drain():
        log.info("draining: finishing in-flight requests (up to %.0f s)", state.settings.drain_s)
        if heartbeating:
            await asyncio.sleep(HEARTBEAT_INTERVAL_S * 1.5)  # the gateway has heard it
    await server.stop(grace=state.settings.drain_s)
