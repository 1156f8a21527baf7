"""One worker in this process, no gateway and no network, for `sealed bench sealed-path`.

The real servicer (`enclave_worker/servicer.py`), the real engine and the demo tenant's signed-policy
controls (`api.stack.demo_policy_set`: input PII rules, a per-key agent section, sealed decision
records); only the gRPC transport is left out (the handlers are called directly with a stand-in
call context). Three ways to send the same request, so their difference is the cost of each layer:

- `plaintext`: the `Generate` RPC, one choice as the gateway plans it (the gateway runs the OpenAI
  layer; that CPU is the gateway's, not counted here);
- `openai`: the OpenAI layer run inside the worker over the same pipeline, unsealed (the work sealed
  mode moves from the gateway into the worker);
- `sealed`: the `SealedGenerate` RPC: open the HPKE request, the OpenAI layer, seal every frame,
  sign the receipt and the usage record, seal the tenant's decision record. The client's sealing
  of the request is done before the clock starts.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import grpc
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from api.stack import demo_policy_set
from api.tenant_audit import decision_key_public_hex
from enclave_worker.boot import BootedWorker
from enclave_worker.engine import LLMEngine
from enclave_worker.guard import WorkerGuard
from enclave_worker.local_openai import LocalRun, inner_answer
from enclave_worker.sealed import policy_version
from enclave_worker.servicer import WorkerServicer
from enclave_worker.settings import WorkerSettings
from enclave_worker.state import LiveState, WorkerState
from policy.policyset import PolicySet
from protocol.openai.completions import plan_completion
from protocol.openai.schemas import CompletionRequest
from protocol.rpc import worker_pb2
from protocol.sealed import RequestContext, api_key_id, seal_request
from protocol.sealed.caller import CallerCredential
from protocol.sealed.hpke import SealedRequest as ClientSealed

MODES = ("plaintext", "openai", "sealed")
TENANT, MODEL, VERSION, ENDPOINT = "demo", "demo-model", "v1", "/v1/completions"
API_KEY = "sk-sealed-path-bench"
API_KEY_ID = api_key_id(API_KEY)


class CallContext:
    """What the handlers use of a gRPC call's context; an abort ends the request with its status."""

    def add_done_callback(self, callback: Callable[..., None]) -> None:
        pass  # the call never ends early here: the handler's own `finally` settles it

    def set_trailing_metadata(self, metadata: Any) -> None:
        self.trailers = metadata

    def invocation_metadata(self) -> tuple[()]:
        return ()

    async def abort(self, code: grpc.StatusCode, details: str, trailing_metadata: Any = ()) -> None:
        raise RuntimeError(f"the worker refused a benchmark request: {code.name}")


def bench_state(engine: LLMEngine) -> WorkerState:
    """A ready worker serving `engine` under the demo tenant's policy set, as `sealed up` signs it."""
    # The demo policy names its agent by the API key's id: hand it one whose id is API_KEY_ID.
    doc = demo_policy_set(API_KEY, decision_key_public_hex(X25519PrivateKey.generate()))
    # Boot (package, key release, attestation) is not what is measured: the booted worker's seam.
    booted = cast(BootedWorker, SimpleNamespace(engine=engine, model_digest="0" * 64,
                                                released=SimpleNamespace(bundle=None)))
    return WorkerState(WorkerSettings(broker_url="http://unused", package_dir=Path("/nonexistent"),
                                      tenant=TENANT, model=MODEL, version=VERSION),
                       guard=WorkerGuard(PolicySet.from_dict(doc | {"tenant": TENANT})),
                       live=LiveState.serving(booted))


def completion_body(prompt: str, output_len: int) -> bytes:
    """The request `sealed bench serve` sends: streamed, greedy, a fixed number of tokens."""
    return json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": output_len, "temperature": 0.0,
                       "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}).encode()


@dataclass
class Timed:
    """One request's in-process time to its first answer byte, and its chunk count."""

    ttft_s: float
    chunks: int


@dataclass
class Prepared:
    """One request as it reaches the worker: what the gateway (the plan) or the client (the sealing)
    did before is done here, outside the measured CPU."""

    mode: str
    rid: str
    request: worker_pb2.GenerateRequest | worker_pb2.SealedRequest | bytes
    client: ClientSealed | None = None


class PathWorker:
    """The three ways in (MODES) to one worker: `prepare(mode, prompt, rid)`, then `answer(prepared)`."""

    def __init__(self, state: WorkerState, output_len: int, keep: bool = False) -> None:
        self.state, self.output_len = state, output_len
        self.servicer = WorkerServicer(state)
        # keep: each answer's chunks (and what a sealed one's client kept), so a test can check what was measured
        self.keep, self.kept = keep, dict[str, tuple[list[Any], ClientSealed | None]]()

    def prepare(self, mode: str, prompt: str, rid: str) -> Prepared:
        body = completion_body(prompt, self.output_len)
        if mode == "plaintext":  # the gateway's OpenAI layer plans the one choice
            plan = plan_completion(CompletionRequest.model_validate_json(body), rid=rid, tenant=TENANT,
                                   key_id=API_KEY_ID)
            (request,) = plan.requests
            return Prepared(mode, rid, request)
        if mode == "openai":
            return Prepared(mode, rid, body)
        if mode == "sealed":
            message, client = self.sealed_request(body, rid)
            return Prepared(mode, rid, message, client)
        raise ValueError(f"unknown mode {mode!r}; one of {', '.join(MODES)}")

    async def answer(self, p: Prepared) -> Timed:
        if isinstance(p.request, worker_pb2.GenerateRequest):
            return await self._timed(p.rid, self.servicer.Generate(p.request, _context()))
        if isinstance(p.request, worker_pb2.SealedRequest):
            return await self._timed(p.rid, self.servicer.SealedGenerate(p.request, _context()), p.client)
        return await self._timed(p.rid, self._unsealed(p.request, p.rid))

    async def send(self, mode: str, prompt: str, rid: str) -> Timed:
        return await self.answer(self.prepare(mode, prompt, rid))

    def sealed_request(self, body: bytes, rid: str) -> tuple[worker_pb2.SealedRequest, ClientSealed]:
        """What the client seals and the gateway relays (the client's work is outside the worker),
        and what the client keeps to open and check the answer."""
        key, s = self.state.serving_key, self.state.settings
        ctx = RequestContext(TENANT, MODEL, ENDPOINT, key.key_id, version=s.version, api_key_id=API_KEY_ID,
                             policy_version=policy_version(self.state))
        # The caller's credential inside the envelope, as SealedOpenAI sends it: the demo policy's caller
        # list names this key (policy/callers.py), and the worker checks it.
        caller = CallerCredential(api_key=API_KEY).encode()
        sealed = seal_request(key.public_bytes, ctx, body, time.time(), caller=caller)
        return worker_pb2.SealedRequest(request_id=rid, tenant=TENANT, key_id=API_KEY_ID, model=MODEL,
                                        endpoint=ENDPOINT, worker_key_id=key.key_id, body=sealed.wire), sealed

    async def _timed(self, rid: str, chunks: AsyncIterator[Any], client: ClientSealed | None = None) -> Timed:
        start, first, seen = time.perf_counter(), 0.0, list[Any]()
        async for chunk in chunks:
            if not seen:
                first = time.perf_counter() - start
            seen.append(chunk)
        if self.keep:
            self.kept[rid] = (seen, client)
        return Timed(first, len(seen))

    async def _unsealed(self, body: bytes, rid: str) -> AsyncIterator[bytes]:
        request = worker_pb2.SealedRequest(request_id=rid, tenant=TENANT, key_id=API_KEY_ID, model=MODEL,
                                           endpoint=ENDPOINT)
        run = LocalRun(self.state)
        try:
            _, parts = await inner_answer(self.state, request, body, run)
            async for part in parts:
                yield part
        finally:
            await run.close()


def _context() -> grpc.aio.ServicerContext:
    return cast(grpc.aio.ServicerContext, CallContext())
