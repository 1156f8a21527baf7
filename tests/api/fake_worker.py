"""A stand-in worker process for routing tests: the real gRPC protocol, heartbeats and signed usage,
with a canned answer instead of a model (so several can run on a small machine).

`python -m tests.api.fake_worker --gateway URL --token-file F --version V --grpc-port P --http-port H`
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import uvicorn
from fastapi import FastAPI

from enclave_worker.engine import InvalidRequestError
from enclave_worker.heartbeat import heartbeats
from enclave_worker.response_state import StateCipher, check_document
from enclave_worker.settings import WorkerSettings
from enclave_worker.state import LiveState, WorkerState
from protocol.asgi import freeze_startup_heap
from protocol.rpc import worker_pb2, worker_pb2_grpc


class FakeServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, state: WorkerState, delay: float) -> None:
        self.state, self.delay = state, delay

    async def Status(self, request: worker_pb2.StatusRequest, context: grpc.aio.ServicerContext
                     ) -> worker_pb2.StatusReply:
        # As the real worker answers it: health checks and the gateway's delivery probe call it.
        report = self.state.report()
        return worker_pb2.StatusReply(status=report.status, worker_status=report.model_dump_json())

    async def Tokenize(self, request: worker_pb2.TokenizeRequest, context: grpc.aio.ServicerContext
                       ) -> worker_pb2.TokenizeReply:
        # A byte tokenizer: enough to carry the protocol.
        text = request.prompt if request.kind == "completion" else request.messages_json
        ids = list(text.encode())
        return worker_pb2.TokenizeReply(tokens=ids, max_model_len=2048,
                                        token_strs=[chr(i) for i in ids] if request.return_token_strs else [])

    async def Detokenize(self, request: worker_pb2.DetokenizeRequest, context: grpc.aio.ServicerContext
                         ) -> worker_pb2.DetokenizeReply:
        if any(t > 255 for t in request.tokens):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "token id out of range")
        return worker_pb2.DetokenizeReply(prompt=bytes(request.tokens).decode(errors="replace"))

    def _state_cipher(self) -> StateCipher:
        # The real worker derives it from its released data key; the stand-in has none, so a fixed one.
        s = self.state.settings
        return StateCipher.derive(b"stand-in data key", s.tenant, s.model, s.version)

    async def SealState(self, request: worker_pb2.SealStateRequest, context: grpc.aio.ServicerContext
                        ) -> worker_pb2.SealStateReply:
        try:
            blob = self._state_cipher().seal(request.id, check_document(request.document_json), time.time() + 3600)
        except InvalidRequestError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return worker_pb2.SealStateReply(blob=blob, version=self.state.settings.version)

    async def OpenState(self, request: worker_pb2.OpenStateRequest, context: grpc.aio.ServicerContext
                        ) -> worker_pb2.OpenStateReply:
        try:
            document = self._state_cipher().open(request.state.id, request.state.blob, time.time())
        except InvalidRequestError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return worker_pb2.OpenStateReply(document_json=json.dumps(document))

    async def Generate(self, request: worker_pb2.GenerateRequest, context: grpc.aio.ServicerContext
                       ) -> AsyncIterator[worker_pb2.GenerateChunk]:
        n, started = request.params.max_tokens, time.monotonic()
        for i in range(n):
            await asyncio.sleep(self.delay)
            last = i == n - 1
            # "-killed" echoes the agent kill switch the gateway forwarded (the real worker refuses tools)
            mark = "-killed" if request.agent_killed else ""
            chunk = worker_pb2.GenerateChunk(text=f"{self.state.settings.version}{mark} ", prompt_tokens=3,
                                             completion_tokens=i + 1, finish_reason="length" if last else "")
            if last:
                chunk.usage.CopyFrom(self.state.signer.usage(request, 3, n, time.monotonic() - started, time.time()))
            yield chunk


async def main_async(args: argparse.Namespace) -> None:
    settings = WorkerSettings(broker_url="", package_dir=Path("."), tenant=args.tenant, model=args.model,
                              version=args.version, host="127.0.0.1", port=args.http_port)
    state = WorkerState(settings, live=LiveState(status="ready"))
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(FakeServicer(state, args.delay), server)
    address = f"127.0.0.1:{args.grpc_port}"
    server.add_insecure_port(address)
    await server.start()
    freeze_startup_heap()  # as the real worker's lifespan does (protocol/asgi.py)
    token = Path(args.token_file).read_text().strip()
    beat = asyncio.create_task(heartbeats(state, [args.gateway], token, address, interval=0.3))
    app = FastAPI()
    app.get("/internal/attestation")(lambda: {"tee": "sim", "insecure": True, "evidence": None, "token": None})
    try:
        await uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=args.http_port, log_level="warning")).serve()
    finally:
        beat.cancel()
        await server.stop(0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--gateway", required=True)
    p.add_argument("--token-file", required=True)
    p.add_argument("--tenant", default="acme")
    p.add_argument("--model", default="m")
    p.add_argument("--version", default="v1")
    p.add_argument("--grpc-port", type=int, required=True)
    p.add_argument("--http-port", type=int, required=True)
    p.add_argument("--delay", type=float, default=0.02)
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
