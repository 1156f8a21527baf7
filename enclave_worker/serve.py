"""Serving one worker process: the gRPC service (over mutual TLS when a gateway certificate is
pinned), the internal HTTP app (status, attestation, boot), heartbeats, and the drain on SIGTERM,
all in one event loop."""

from __future__ import annotations

import asyncio
import logging

import grpc
import uvicorn
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from attestation.bundle import channel_binding
from enclave_worker.heartbeat import HEARTBEAT_INTERVAL_S, heartbeats
from enclave_worker.server import WorkerState, create_app
from enclave_worker.servicer import WorkerServicer
from enclave_worker.settings import WorkerSettings
from policy.audit.worker_record import public_key_bytes
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


async def serve(settings: WorkerSettings, grpc_port: int, register_urls: list[str], register_token: str,
                gateway_client_cert: bytes | None = None, advertise_host: str | None = None) -> None:
    state = WorkerState(settings, tracing=tracing_from_env("worker"))
    # No SO_REUSEPORT (gRPC's default on Linux): a second process binding this port must fail, not
    # take a share of the gateway's connections.
    server = grpc.aio.server(options=[("grpc.max_concurrent_streams", 4096),
                                      ("grpc.max_receive_message_length", 32 << 20), ("grpc.so_reuseport", 0)])
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkerServicer(state), server)  # type: ignore[no-untyped-call]
    tls_cert, spki = _listen(server, f"{settings.host}:{grpc_port}", gateway_client_cert)
    # Before boot: the evidence the key broker sees commits to exactly these channel keys.
    state.channel_binding, state.tls_spki = channel_binding(spki, public_key_bytes(state.usage_key)), spki
    app = create_app(settings, state)

    async def drain() -> None:
        """Scale-in and rollouts end a worker with SIGTERM: say "draining" (the gateway stops
        routing here), then let gRPC finish the streams in flight, bounded by `drain_s`."""
        if state.status == "ready":
            state.status = "draining"
            log.info("draining: finishing in-flight requests (up to %.0f s)", settings.drain_s)
            if register_urls:
                await asyncio.sleep(HEARTBEAT_INTERVAL_S * 1.5)  # the gateway has heard it
        await server.stop(grace=settings.drain_s)

    state.drain = drain
    await server.start()
    # Bound to all interfaces in a pod: the gateway is told the pod's own address.
    public = advertise_host or settings.host
    beat = asyncio.create_task(heartbeats(state, register_urls, register_token, f"{public}:{grpc_port}",
                                          tls_cert=tls_cert)) if register_urls else None
    http = uvicorn.Server(uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning",
                                         access_log=False))
    try:
        await http.serve()
    finally:
        if beat is not None:
            beat.cancel()
        await server.stop(grace=1.0)
        state.tracing.shutdown()
