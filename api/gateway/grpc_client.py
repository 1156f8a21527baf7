"""The gateway's side of the worker protocol: one channel per worker, server-streaming Generate.

Closing the iterator (client disconnected, error, shutdown) cancels the RPC, and the worker aborts
the request in its engine. A worker that vanishes mid-stream surfaces as WorkerLost.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncGenerator, Iterable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from api.gateway.errors import GatewayError
from policy.audit.worker_record import DECISION_METADATA_KEY
from protocol.rpc import worker_pb2, worker_pb2_grpc
from protocol.rpc.snapshot_segments import SegmentAssembler, SnapshotName, SnapshotTransferError
from protocol.sealed.decision_record import RECORD_METADATA_KEY
from protocol.tls import TARGET_NAME, TlsIdentity


class WorkerLost(GatewayError):
    def __init__(self) -> None:
        super().__init__(502, "the worker serving this request stopped; the answer is incomplete",
                         type_="server_error", code="worker_lost")


class WorkerRefusal(GatewayError):
    """The worker's in-enclave policy refused the request; `worker_decisions` are its signed
    decisions (from the call's trailers), which the service verifies and audits."""

    def __init__(self, message: str, worker_decisions: list[worker_pb2.UsageRecord]) -> None:
        super().__init__(403, message, code="content_policy_violation")
        self.worker_decisions = worker_decisions


class SnapshotNeeded(GatewayError):
    """The worker does not hold the vector store snapshot a call named (NOT_FOUND, retrieval_rpcs.py):
    the gateway sends it (write_snapshot) and calls again; never an answer to the caller as such."""

    def __init__(self) -> None:
        super().__init__(503, "the vector store could not be loaded by its worker; retry", type_="server_error",
                         code="model_unavailable", headers={"Retry-After": "1"})


class WorkerUnavailable(GatewayError):
    """The worker could not take the call at all (connection refused, shutting down): try another."""

    def __init__(self) -> None:
        super().__init__(503, "model unavailable: worker unreachable", type_="model_unavailable",
                         code="model_unavailable", headers={"Retry-After": "2"})


# gRPC metadata: (key, value) pairs; values of "-bin" keys are bytes (grpc ships no type hints).
Metadata = Iterable[tuple[str, str | bytes]]
# Messages a little over the gateway's body limit (JSON escapes, the chat template's hint) must fit.
MAX_MESSAGE_BYTES = 32 << 20


class Health(enum.Enum):
    """What a worker's Status RPC said."""

    READY = "ready"
    NOT_READY = "not_ready"  # it answered, and is not ready (draining, loading)
    UNREACHABLE = "unreachable"  # refused, reset, or an error status: the worker or its host said so
    SILENT = "silent"  # no answer before the deadline: the worker hung, or the gateway's own loop did


class WorkerClients:
    def __init__(self, identity: TlsIdentity | None = None, connect_timeout_s: float = 5.0) -> None:
        self._identity = identity
        self.connect_timeout_s = connect_timeout_s
        self._channels: dict[tuple[str, str], tuple[grpc.aio.Channel, worker_pb2_grpc.WorkerStub]] = {}

    async def forget(self, address: str, worker_cert: str = "") -> None:
        """Drop a channel to a worker that is gone (a restarted worker has a new certificate)."""
        entry = self._channels.pop((address, worker_cert), None)
        if entry is not None:
            await entry[0].close()

    async def _connected(self, address: str, worker_cert: str) -> worker_pb2_grpc.WorkerStub:
        """The stub, once its channel is connected: a dead or replaced worker (refused connection,
        a certificate that is no longer its) fails within `connect_timeout_s`, never at the RPC deadline."""
        stub = self.stub(address, worker_cert)
        channel = self._channels[(address, worker_cert)][0]
        if channel.get_state(try_to_connect=True) != grpc.ChannelConnectivity.READY:
            try:
                await asyncio.wait_for(channel.channel_ready(), self.connect_timeout_s)
            except TimeoutError as exc:
                await self.forget(address, worker_cert)
                raise WorkerUnavailable() from exc  # another worker may take the call
        return stub

    def stub(self, address: str, worker_cert: str = "") -> worker_pb2_grpc.WorkerStub:
        key = (address, worker_cert)
        if key not in self._channels:
            options = [("grpc.max_concurrent_streams", 4096), ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                       ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
            if worker_cert and self._identity is not None:
                # Trust exactly the certificate this worker registered with, and present ours.
                creds = grpc.ssl_channel_credentials(root_certificates=worker_cert.encode(),
                                                     private_key=self._identity.key_pem,
                                                     certificate_chain=self._identity.cert_pem)
                channel = grpc.aio.secure_channel(address, creds,
                                                  options=[*options, ("grpc.ssl_target_name_override", TARGET_NAME)])
            else:
                channel = grpc.aio.insecure_channel(address, options=options)
            self._channels[key] = (channel, worker_pb2_grpc.WorkerStub(channel))
        return self._channels[key][1]

    async def close(self) -> None:
        for channel, _ in self._channels.values():
            await channel.close()
        self._channels.clear()

    async def health(self, address: str, worker_cert: str = "", timeout_s: float = 2.0) -> Health:
        """The health check: the worker's Status RPC, and what its answer (or silence) says."""
        try:
            reply: worker_pb2.StatusReply = await self.stub(address, worker_cert).Status(worker_pb2.StatusRequest(),
                                                                                         timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            return Health.SILENT if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED else Health.UNREACHABLE
        return Health.READY if reply.status == "ready" else Health.NOT_READY

    async def unary(self, address: str, worker_cert: str, method: str, request: Any, timeout_s: float) -> Any:
        """A unary RPC (Tokenize, Detokenize); errors come back as that request's answer."""
        try:
            return await getattr(self.stub(address, worker_cert), method)(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, started=False) from exc

    async def write_snapshot(self, address: str, worker_cert: str, segments: Iterable[worker_pb2.StoreSnapshotSegment],
                             timeout_s: float) -> None:
        """A vector store's sealed snapshot to a worker that lacks it, in segments (WriteStoreSnapshot)."""
        try:
            await self.stub(address, worker_cert).WriteStoreSnapshot(iter(segments), timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, started=False) from exc

    async def read_snapshot(self, address: str, worker_cert: str, request: worker_pb2.ReadStoreSnapshotRequest,
                            timeout_s: float) -> bytes:
        """The snapshot a worker just made (ReadStoreSnapshot): whole, in order, of the digest it named."""
        assembler = SegmentAssembler()
        try:
            async for segment in self.stub(address, worker_cert).ReadStoreSnapshot(request, timeout=timeout_s):
                assembler.add(segment)
            tenant, name, blob = assembler.finish()
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, started=False) from exc
        except SnapshotTransferError as exc:
            raise GatewayError(502, f"the worker's vector store snapshot is malformed: {exc}", type_="server_error",
                               code="worker_error") from None
        if (tenant, name) != (request.tenant, SnapshotName.of(request.ref)):
            raise GatewayError(502, "the worker sent another vector store snapshot than the one asked for",
                               type_="server_error", code="worker_error")
        return blob

    async def embed(self, address: str, worker_cert: str, request: worker_pb2.EmbedRequest, timeout_s: float,
                    metadata: Metadata | None = None) -> tuple[worker_pb2.EmbedReply, list[worker_pb2.UsageRecord]]:
        """Worker.Embed, and the signed decisions its trailers carry (redactions, for the audit trail)."""
        try:
            call = self.stub(address, worker_cert).Embed(request, timeout=timeout_s, metadata=metadata)
            reply: worker_pb2.EmbedReply = await call
            return reply, _decision_records(await call.trailing_metadata())
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, started=False) from exc

    async def open(self, address: str, request: worker_pb2.GenerateRequest | worker_pb2.SealedRequest,
                   timeout_s: float, worker_cert: str = "", metadata: Metadata | None = None
                   ) -> tuple[Any, WorkerStream]:
        """Start generating (Generate, or SealedGenerate for a sealed request) and wait for the first
        chunk (sealed: the sealed response head), so that errors before it can be retried.
        ``metadata``: the call's W3C trace context when tracing is on (api/gateway/spans.py)."""
        sealed = isinstance(request, worker_pb2.SealedRequest)
        stub = self.stub(address, worker_cert) if sealed else await self._connected(address, worker_cert)
        call = (stub.SealedGenerate if sealed else stub.Generate)(request, timeout=timeout_s, metadata=metadata)
        try:
            first = await call.read()
        except grpc.aio.AioRpcError as exc:
            call.cancel()
            if exc.code() == grpc.StatusCode.UNAVAILABLE and not sealed:
                await self.forget(address, worker_cert)
            raise (_translate_sealed(exc) if sealed else _translate(exc, started=False)) from exc
        except BaseException:
            call.cancel()
            raise
        if first is grpc.aio.EOF:
            raise GatewayError(502, "the worker returned no output", type_="server_error")
        return first, WorkerStream(call)  # sealed: its `sealed_record` is the tenant's record of the decisions


def _translate_sealed(exc: grpc.aio.AioRpcError) -> GatewayError:
    code, detail = exc.code(), exc.details() or ""
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return GatewayError(409, detail or "re-attest", code="reattest_required")
    if code == grpc.StatusCode.ALREADY_EXISTS:
        return GatewayError(400, detail or "replayed", code="sealed_request_replayed")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return GatewayError(400, detail or "sealed request rejected", code="sealed_request_rejected")
    if code == grpc.StatusCode.PERMISSION_DENIED:  # before it opened: the tenant's caller policy refused
        return GatewayError(403, detail or "caller refused", type_="permission_error", code="caller_not_allowed")
    return _translate(exc, started=False)


def _decision_records(metadata: Metadata | None) -> list[worker_pb2.UsageRecord]:
    """The worker's signed in-enclave decisions from gRPC trailing metadata (verified by the service)."""
    out: list[worker_pb2.UsageRecord] = []
    for key, value in tuple(metadata or ()):
        if key == DECISION_METADATA_KEY and isinstance(value, bytes) and len(out) < 16:
            try:
                out.append(worker_pb2.UsageRecord.FromString(value))
            except DecodeError:
                continue
    return out


def _sealed_record(metadata: Metadata | None) -> bytes | None:
    """The tenant's sealed decision record from a SealedGenerate call's trailers (opaque here)."""
    for key, value in tuple(metadata or ()):
        if key == RECORD_METADATA_KEY and isinstance(value, bytes):
            return value
    return None


class WorkerStream:
    """The rest of a Generate or SealedGenerate stream; after it ends, ``decisions`` holds the
    worker's signed in-enclave decisions sent as trailing metadata (plaintext mode: redactions,
    calls held for approval) and ``sealed_record`` the tenant's sealed record (sealed mode)."""

    def __init__(self, call: grpc.aio.UnaryStreamCall) -> None:
        self._call = call
        self.decisions: list[worker_pb2.UsageRecord] = []
        self.sealed_record: bytes | None = None
        self._it = self._chunks()

    def __aiter__(self) -> WorkerStream:
        return self

    async def __anext__(self) -> Any:  # a GenerateChunk, or a SealedChunk
        return await self._it.__anext__()

    async def aclose(self) -> None:
        await self._it.aclose()
        self._call.cancel()  # also when the stream was never read (its generator's cleanup never ran)

    async def _chunks(self) -> AsyncGenerator[Any, None]:
        try:
            while True:
                chunk = await self._call.read()
                if chunk is grpc.aio.EOF:
                    trailers = await self._call.trailing_metadata()
                    self.decisions, self.sealed_record = _decision_records(trailers), _sealed_record(trailers)
                    return
                yield chunk
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, started=True) from exc
        finally:
            self._call.cancel()  # no-op when finished; otherwise propagates cancellation to the engine


def _translate(exc: grpc.aio.AioRpcError, started: bool) -> GatewayError:
    """A request's error is that request's answer: nothing here says the worker is dead (heartbeats do)."""
    code = exc.code()
    if code == grpc.StatusCode.PERMISSION_DENIED:
        # The worker's in-enclave policy refused the prompt, the answer or a tool call; its signed
        # decision rides along for the audit trail.
        return WorkerRefusal(exc.details() or "refused by policy", _decision_records(exc.trailing_metadata()))
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return GatewayError(400, exc.details() or "invalid request", code="invalid_value")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return GatewayError(413, "the request is too large", code="request_too_large")
    if code == grpc.StatusCode.DATA_LOSS:  # the model's answer is unusable, e.g. a malformed tool call
        return GatewayError(500, exc.details() or "the model's output is malformed", type_="server_error",
                            code="invalid_tool_call")
    if code == grpc.StatusCode.FAILED_PRECONDITION:  # sealed data this worker cannot open (retrieval_rpcs.py)
        return GatewayError(409, exc.details() or "stored data cannot be opened", code="sealed_data_unreadable")
    if code == grpc.StatusCode.NOT_FOUND:  # a vector store snapshot the worker does not hold (retrieval_rpcs.py)
        return SnapshotNeeded()
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return GatewayError(501, exc.details() or "not supported by this worker", code="not_supported")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return GatewayError(504, "the worker did not finish in time", type_="server_error", code="timeout")
    if started:
        return WorkerLost()
    if code == grpc.StatusCode.UNAVAILABLE:
        return WorkerUnavailable()
    # UNKNOWN, INTERNAL, ...: the worker failed on this request; another worker would fail the same way.
    return GatewayError(500, "the worker failed to process this request", type_="server_error",
                        code="worker_error")
