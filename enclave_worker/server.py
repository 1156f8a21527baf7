"""The worker's internal API (gateway -> worker): status, attestation, streaming generation.

Boot happens in the background so the gateway can see "starting" and "failed" states; a failed
boot (for instance, the key broker refused the key) is reported as unavailable, never as a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from api.proto import worker_pb2
from enclave_worker.boot import BootedWorker, boot
from enclave_worker.chat_format import render_chat
from enclave_worker.engine import InvalidRequestError, SamplingParams
from enclave_worker.schemas import GenerateRequest
from enclave_worker.settings import WorkerSettings

log = logging.getLogger(__name__)


@dataclass
class WorkerState:
    settings: WorkerSettings
    status: str = "starting"  # starting | ready | failed
    booted: BootedWorker | None = None
    salt_secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    # Signs usage records; made at boot and never stored, so only this process can sign as this worker.
    usage_key: Ed25519PrivateKey = field(default_factory=Ed25519PrivateKey.generate)

    def sign_usage(self, record: dict) -> worker_pb2.UsageRecord:
        payload = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
        public = self.usage_key.public_key().public_bytes(serialization.Encoding.Raw,
                                                          serialization.PublicFormat.Raw)
        return worker_pb2.UsageRecord(payload=payload, signature=self.usage_key.sign(payload),
                                      public_key=public)

    def cache_salt(self, tenant: str) -> bytes:
        # Derived here, never taken from a client: tenants cannot share or probe each other's prefix cache.
        return hmac.new(self.salt_secret, tenant.encode(), hashlib.sha256).digest()


def _error(status: int, message: str, type_: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": type_}})


async def _boot(state: WorkerState) -> None:
    try:
        state.booted = await asyncio.to_thread(boot, state.settings)
        state.status = "ready"
    except Exception as exc:  # the reason is logged by type only: it may not carry secrets, but keep it terse
        state.status = "failed"
        log.error("worker boot failed: %s", type(exc).__name__)


def create_app(settings: WorkerSettings, state: WorkerState | None = None) -> FastAPI:
    state = state or WorkerState(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(_boot(state))
        yield
        task.cancel()
        if state.booted is not None:
            await state.booted.engine.shutdown()

    app = FastAPI(title="Sealed worker (internal)", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.worker = state

    @app.get("/internal/status")
    def status() -> dict:
        s = state.settings
        return {"status": state.status, "tenant": s.tenant, "model": s.model, "version": s.version,
                "tee": s.tee, "insecure": s.tee == "sim",
                "stats": state.booted.engine.stats() if state.booted else {}}

    @app.get("/internal/attestation")
    def attestation() -> JSONResponse:
        if state.booted is None:
            return _error(503, "model unavailable", "unavailable")
        released = state.booted.released
        return JSONResponse({"tee": state.settings.tee, "insecure": state.settings.tee == "sim",
                             "evidence": released.bundle.to_json(), "token": released.token,
                             "model_digest": state.booted.model_digest})

    @app.post("/internal/generate", response_model=None)
    async def generate(body: GenerateRequest, request: Request) -> StreamingResponse | JSONResponse:
        if state.booted is None:
            return _error(503, "model unavailable", "unavailable")
        engine = state.booted.engine
        try:
            if body.kind == "chat":
                text = render_chat(engine.tokenizer, engine.tokenizer.chat_template, body.messages or [],
                                   body.tools)
            else:
                text = body.prompt or ""
            prompt_ids = engine.tokenizer.encode(text)
            p = body.params
            params = SamplingParams(max_tokens=p.max_tokens, temperature=p.temperature, top_p=p.top_p,
                                    top_k=p.top_k, seed=p.seed, stop=tuple(p.stop),
                                    stop_token_ids=tuple(p.stop_token_ids), logprobs=p.logprobs)
            stream = engine.generate(body.request_id, prompt_ids, params, cache_salt=state.cache_salt(body.tenant))
            first = await anext(stream)
        except InvalidRequestError as exc:
            return _error(400, str(exc))

        async def lines() -> AsyncIterator[bytes]:
            out = first
            try:
                while True:
                    yield (json.dumps({
                        "text": out.delta_text, "token_ids": list(out.delta_token_ids),
                        "finish_reason": out.finish_reason, "prompt_tokens": out.prompt_tokens,
                        "completion_tokens": out.completion_tokens,
                        "logprobs": out.logprobs,
                    }) + "\n").encode()
                    if out.finished:
                        return
                    out = await anext(stream)
            finally:
                await stream.aclose()

        return StreamingResponse(lines(), media_type="application/x-ndjson",
                                 headers={"X-Sealed-TEE": state.settings.tee,
                                          "X-Sealed-Insecure": str(state.settings.tee == "sim").lower()})

    return app
