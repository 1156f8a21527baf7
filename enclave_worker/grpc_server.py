"""The worker's gRPC service (server-streaming generation) and its process entry point.

`python -m enclave_worker.grpc_server ...` runs the internal HTTP app (status, attestation) and the
gRPC service in one event loop, and sends heartbeats to the gateways it is told about. Cancelling
the gRPC call (client gone, gateway gave up) cancels the handler, and the engine stream's cleanup
aborts the request in the engine, so its KV blocks are freed at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import uvicorn
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from attestation.bundle import channel_binding
from attestation.errors import UnsupportedError
from enclave_worker.attesters import resolve_tee
from enclave_worker.chat_format import chat_prompt_ids
from enclave_worker.engine import EngineError, InvalidRequestError
from enclave_worker.guard import GuardNote, GuardRefusal
from enclave_worker.sealed import SealedRefusal, answer_sealed, open_sealed_request
from enclave_worker.server import WorkerState, create_app, serving
from enclave_worker.settings import WorkerSettings
from policy.audit.worker_record import DECISION_METADATA_KEY, public_key_bytes, sign_decision
from protocol.asgi import freeze_startup_heap, schedule_full_collections
from protocol.heartbeat import heartbeat_signing_input, worker_id_for
from protocol.openai.errors import OpenAIError
from protocol.rpc import worker_pb2, worker_pb2_grpc
from protocol.rpc.sampling import from_wire
from protocol.tls import make_identity
from protocol.toolcalls import strip_tool_calls
from protocol.worker_status import Heartbeat

log = logging.getLogger(__name__)


_GRPC_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 403: grpc.StatusCode.PERMISSION_DENIED,
               503: grpc.StatusCode.UNAVAILABLE}


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, state: WorkerState) -> None:
        self.state = state

    async def Status(self, request: worker_pb2.StatusRequest, context: grpc.aio.ServicerContext
                     ) -> worker_pb2.StatusReply:
        report = self.state.report()
        return worker_pb2.StatusReply(status=report.status, worker_status=report.model_dump_json())

    def _decisions(self, request: worker_pb2.GenerateRequest, notes: list[GuardNote],
                   refusal: GuardRefusal | None = None) -> tuple[tuple[str, bytes], ...]:
        """The in-enclave decisions of this request, each signed with the attested usage key, as
        gRPC trailing metadata: the gateway verifies them and appends them to the audit trail."""
        items = [(n.action, n.outcome, n.decision) for n in notes]
        if refusal is not None and refusal.decision is not None:
            items.append((refusal.action, "deny", refusal.decision))
        out = []
        for action, outcome, decision in items:
            payload, signature = sign_decision(
                self.state.usage_key, request_id=request.request_id[:128], tenant=request.tenant[:128],
                key_id=request.key_id[:128], model=self.state.settings.model, version=self.state.settings.version,
                action=action, decision=outcome, rule=decision.rule[:128], policy_id=decision.policy_id[:128],
                policy_version=decision.policy_version, at=round(time.time(), 3))
            record = worker_pb2.UsageRecord(payload=payload, signature=signature,
                                            public_key=public_key_bytes(self.state.usage_key))
            out.append((DECISION_METADATA_KEY, record.SerializeToString()))
        return tuple(out)

    def _refused(self, request: worker_pb2.GenerateRequest, notes: list[GuardNote], exc: GuardRefusal) -> OpenAIError:
        error = OpenAIError(403, str(exc), code="content_policy_violation")
        error.worker_decisions = self._decisions(request, notes, exc)  # type: ignore[attr-defined]
        return error

    def _prompt(self, request: worker_pb2.GenerateRequest, notes: list[GuardNote] | None = None,
                add_generation_prompt: bool = True) -> list[int]:
        """The prompt's token ids. Anything wrong with the request's content is InvalidRequestError
        (INVALID_ARGUMENT), never an unhandled error: the gateway must not take it for a sick worker."""
        try:
            ids = self._prompt_ids(request, notes, add_generation_prompt)
        except (GuardRefusal, InvalidRequestError):
            raise
        except Exception as exc:  # malformed JSON, a template error, text the tokenizer refuses, ...
            log.info("request %s refused: %s", request.request_id, type(exc).__name__)
            raise InvalidRequestError(f"the request cannot be rendered ({type(exc).__name__})") from None
        if not ids:
            raise InvalidRequestError("the prompt is empty")
        return ids

    def _prompt_ids(self, request: worker_pb2.GenerateRequest, notes: list[GuardNote] | None,
                    add_generation_prompt: bool) -> list[int]:
        engine = self.state.booted.engine  # type: ignore[union-attr]
        guard, model = self.state.guard, self.state.settings.model
        if request.kind == "chat":
            messages = json.loads(request.messages_json)
            if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
                raise InvalidRequestError("messages must be a list of objects")
            if guard is not None:  # data controls on every text the model will read
                messages = guard.check_messages(request.key_id, model, messages, notes)
            return chat_prompt_ids(engine.tokenizer, engine.tokenizer.chat_template, messages,
                                   json.loads(request.tools_json) if request.tools_json else None,
                                   request.assistant_prefix, add_generation_prompt)
        # /v1/completions: the caller writes the whole prompt, special tokens included (as in vLLM).
        prompt = guard.check_input(request.key_id, model, [request.prompt], notes)[0] if guard else request.prompt
        return engine.tokenizer.encode(prompt + request.assistant_prefix)

    def _logprobs(self, out_logprobs: tuple | None) -> list[worker_pb2.TokenLogprob]:
        if not out_logprobs:
            return []
        tok = self.state.booted.engine.tokenizer  # type: ignore[union-attr]

        def piece(tid: int) -> str:
            return tok.decode([tid], skip_special_tokens=False)

        return [worker_pb2.TokenLogprob(
            token=piece(lp.token_id), logprob=lp.logprob, token_bytes=piece(lp.token_id).encode(),
            top=[worker_pb2.TopLogprob(token=piece(t), logprob=v, token_bytes=piece(t).encode()) for t, v in lp.top],
        ) for lp in out_logprobs]

    async def Tokenize(self, request: worker_pb2.TokenizeRequest, context: grpc.aio.ServicerContext
                       ) -> worker_pb2.TokenizeReply:
        """The token ids the engine would see for this prompt (the same rendering and data controls)."""
        if not serving(self.state):
            await context.abort(grpc.StatusCode.UNAVAILABLE, "model unavailable")
        as_generate = worker_pb2.GenerateRequest(tenant=request.tenant, key_id=request.key_id, kind=request.kind,
                                                 messages_json=request.messages_json, prompt=request.prompt,
                                                 tools_json=request.tools_json)
        try:
            ids = self._prompt(as_generate, add_generation_prompt=request.add_generation_prompt)
        except GuardRefusal as exc:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        except InvalidRequestError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        tok = self.state.booted.engine.tokenizer  # type: ignore[union-attr]
        strs = [tok.decode([i], skip_special_tokens=False) for i in ids] if request.return_token_strs else []
        return worker_pb2.TokenizeReply(tokens=ids, token_strs=strs, max_model_len=self.state.settings.max_model_len)

    async def Detokenize(self, request: worker_pb2.DetokenizeRequest, context: grpc.aio.ServicerContext
                         ) -> worker_pb2.DetokenizeReply:
        if not serving(self.state):
            await context.abort(grpc.StatusCode.UNAVAILABLE, "model unavailable")
        tok = self.state.booted.engine.tokenizer  # type: ignore[union-attr]
        try:
            text = tok.decode(tok.check_ids(request.tokens), skip_special_tokens=False)
        except InvalidRequestError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return worker_pb2.DetokenizeReply(prompt=text)

    async def Generate(self, request: worker_pb2.GenerateRequest, context: grpc.aio.ServicerContext
                       ) -> AsyncIterator[worker_pb2.GenerateChunk]:
        policy_set = self.state.guard.policy_set if self.state.guard else None
        if policy_set is not None and policy_set.require_sealed:
            # The tenant's signed policy: prompts reach this worker only sealed (docs/sealed-mode.md).
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "this tenant requires sealed mode")
        notes: list[GuardNote] = []
        try:
            async for chunk in self.generate(request, notes):
                yield chunk
        except OpenAIError as exc:
            # A policy refusal carries the worker's signed decision for the gateway's audit trail.
            await context.abort(_GRPC_CODES.get(exc.status, grpc.StatusCode.UNAVAILABLE), exc.message,
                                trailing_metadata=getattr(exc, "worker_decisions", ()))
        if notes:  # redactions, calls held for approval: signed, at the end of the answer
            context.set_trailing_metadata(self._decisions(request, notes))

    async def SealedGenerate(self, request: worker_pb2.SealedRequest, context: grpc.aio.ServicerContext
                             ) -> AsyncIterator[worker_pb2.SealedChunk]:
        try:
            opened = open_sealed_request(self.state, request)
        except SealedRefusal as exc:
            await context.abort(exc.grpc_code, exc.message)
        decisions: list[tuple[str, bytes]] = []

        async def generate(inner: worker_pb2.GenerateRequest) -> AsyncIterator[worker_pb2.GenerateChunk]:
            # In-enclave decisions on a sealed request are signed and sent like plaintext ones
            # (trailing metadata; ids and rules, never content): the gateway audits them.
            notes: list[GuardNote] = []
            try:
                async for chunk in self.generate(inner, notes):
                    yield chunk
            except OpenAIError as exc:
                decisions.extend(getattr(exc, "worker_decisions", ()))  # a refusal (its notes included)
                raise
            decisions.extend(self._decisions(inner, notes))

        async for chunk in answer_sealed(self.state, generate, request, opened):
            yield chunk
        if decisions:
            context.set_trailing_metadata(tuple(decisions[:16]))

    async def generate(self, request: worker_pb2.GenerateRequest, notes: list[GuardNote] | None = None
                       ) -> AsyncIterator[worker_pb2.GenerateChunk]:
        """One choice on the engine; refusals and failures raise OpenAIError (status as the gateway
        would answer it). Used by the plaintext RPC and by sealed mode."""
        state = self.state
        if not serving(state):
            raise OpenAIError(503, "model unavailable", type_="model_unavailable", code="model_unavailable")
        engine = state.booted.engine  # type: ignore[union-attr]
        started = time.monotonic()
        notes = [] if notes is None else notes
        try:
            prompt_ids = self._prompt(request, notes)
            params = from_wire(request.params)
            if state.guard is not None:
                state.guard.check_admission(request.key_id, state.settings.model, len(prompt_ids), params.max_tokens)
            stream = engine.generate(request.request_id, prompt_ids, params,
                                     cache_salt=state.cache_salt(request.tenant))
            first = await anext(stream)
        except GuardRefusal as exc:
            raise self._refused(request, notes, exc) from exc
        except (InvalidRequestError, ValueError) as exc:
            raise OpenAIError(400, str(exc), code="invalid_value") from exc
        except EngineError as exc:
            raise OpenAIError(503, "engine unavailable", type_="server_error", code="model_unavailable") from exc
        guard = state.guard
        if guard is not None and (guard.buffers_output or (request.tools_json and guard.policy_set)):
            # Output or tool-call controls: nothing leaves the worker before the whole answer is checked.
            async for chunk in self._checked_answer(request, first, stream, started, notes):
                yield chunk
            return
        out = first
        try:
            while True:
                chunk = worker_pb2.GenerateChunk(
                    text=out.delta_text, token_ids=list(out.delta_token_ids), finish_reason=out.finish_reason or "",
                    prompt_tokens=out.prompt_tokens, completion_tokens=out.completion_tokens,
                    logprobs=self._logprobs(out.logprobs))
                if out.finished:
                    chunk.usage.CopyFrom(state.sign_usage({
                        "request_id": request.request_id, "tenant": request.tenant, "key_id": request.key_id,
                        "model": state.settings.model, "version": state.settings.version,
                        "prompt_tokens": out.prompt_tokens, "completion_tokens": out.completion_tokens,
                        "worker_seconds": round(time.monotonic() - started, 6), "at": time.time()}))
                yield chunk
                if out.finished:
                    return
                out = await anext(stream)
        except EngineError as exc:
            raise OpenAIError(503, "engine failed", type_="server_error", code="worker_lost") from exc
        finally:
            await stream.aclose()  # aborts the engine request if it has not finished (cancellation)

    async def _checked_answer(self, request: worker_pb2.GenerateRequest, first: Any, stream: Any,
                              started: float, notes: list[GuardNote]) -> AsyncIterator[worker_pb2.GenerateChunk]:
        state, guard = self.state, self.state.guard
        outs = [first]
        try:
            while not outs[-1].finished:
                outs.append(await anext(stream))
        except EngineError as exc:
            raise OpenAIError(503, "engine failed", type_="server_error", code="worker_lost") from exc
        finally:
            await stream.aclose()
        last, text = outs[-1], "".join(o.delta_text for o in outs)
        # A forced tool choice puts the opening of the call in the prompt: check what the client sees.
        full = request.assistant_prefix + text
        try:
            finish = (guard.check_tools(request.key_id, full, request.agent_killed, notes)  # type: ignore[union-attr]
                      if request.tools_json else "")
            text = guard.check_output(request.key_id, state.settings.model, text, notes)  # type: ignore[union-attr]
        except GuardRefusal as exc:
            raise self._refused(request, notes, exc) from exc
        if finish == "requires_approval":
            # Held back: a human approves before any such call is made.
            text = "" if request.assistant_prefix else strip_tool_calls(text)
        chunk = worker_pb2.GenerateChunk(
            text=text, token_ids=[t for o in outs for t in o.delta_token_ids],
            finish_reason=finish or last.finish_reason or "", prompt_tokens=last.prompt_tokens,
            completion_tokens=last.completion_tokens,
            logprobs=[lp for o in outs for lp in self._logprobs(o.logprobs)])
        chunk.usage.CopyFrom(state.sign_usage({
            "request_id": request.request_id, "tenant": request.tenant, "key_id": request.key_id,
            "model": state.settings.model, "version": state.settings.version,
            "prompt_tokens": last.prompt_tokens, "completion_tokens": last.completion_tokens,
            "worker_seconds": round(time.monotonic() - started, 6), "at": time.time()}))
        yield chunk


HEARTBEAT_INTERVAL_S = 1.0


def heartbeat_body(state: WorkerState, grpc_address: str, tls_cert: str, seq: int) -> dict[str, Any]:
    """One heartbeat, signed by the worker's attested identity (usage) key. It carries what the
    gateway serves on /.well-known/attestation (the gateway fetches nothing from a worker)."""
    s, booted = state.settings, state.booted
    public = state.usage_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    attestation = None
    if booted is not None:
        attestation = {"tee": s.tee, "insecure": s.insecure, "evidence": booted.released.bundle.to_json(),
                       "token": booted.released.token, "model_digest": booted.model_digest,
                       "sealed_key_id": state.serving_key.key_id, "promises": state.promises()}
    body: dict[str, Any] = {
        **state.report().model_dump(mode="json"), "worker_id": worker_id_for(public), "grpc_address": grpc_address,
        "usage_public_key": public.hex(), "pid": os.getpid(), "tls_cert": tls_cert,
        "sealed_key_id": state.serving_key.key_id, "attestation": attestation, "seq": seq, "at": int(time.time())}
    body["signature"] = state.usage_key.sign(heartbeat_signing_input(body)).hex()
    Heartbeat.model_validate(body)  # the message the gateway takes, or an error here
    return body


async def heartbeats(state: WorkerState, urls: list[str], token: str, grpc_address: str,
                     interval: float = HEARTBEAT_INTERVAL_S, tls_cert: str = "") -> None:
    seq = 0
    async with httpx.AsyncClient(timeout=2.0) as client:
        while True:
            seq += 1
            body = heartbeat_body(state, grpc_address, tls_cert, seq)
            for url in urls:
                # The gateway may not be up yet, or restarting: keep beating.
                with contextlib.suppress(httpx.HTTPError):
                    await client.post(f"{url}/internal/workers/heartbeat", json=body,
                                      headers={"Authorization": f"Bearer {token}"})
            await asyncio.sleep(interval)


async def serve(settings: WorkerSettings, grpc_port: int, register_urls: list[str], register_token: str,
                gateway_client_cert: bytes | None = None, advertise_host: str | None = None) -> None:
    state = WorkerState(settings)
    server = grpc.aio.server(options=[("grpc.max_concurrent_streams", 4096),
                                      ("grpc.max_receive_message_length", 32 << 20)])
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkerServicer(state), server)
    address = f"{settings.host}:{grpc_port}"
    tls_cert, spki = "", b""
    if gateway_client_cert:
        # Mutual TLS: a key made now and kept in memory; only the gateway's pinned certificate may call.
        identity = make_identity()
        server.add_secure_port(address, grpc.ssl_server_credentials(
            [(identity.key_pem, identity.cert_pem)], root_certificates=gateway_client_cert,
            require_client_auth=True))
        tls_cert = identity.cert_pem.decode()
        spki = x509.load_pem_x509_certificate(identity.cert_pem).public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    else:
        server.add_insecure_port(address)
    usage_public = state.usage_key.public_key().public_bytes(serialization.Encoding.Raw,
                                                             serialization.PublicFormat.Raw)
    # Before boot: the evidence the key broker sees commits to exactly these channel keys.
    state.channel_binding, state.tls_spki = channel_binding(spki, usage_public), spki
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
                                          tls_cert=tls_cert)
                               ) if register_urls else None
    http = uvicorn.Server(uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning",
                                         access_log=False))
    try:
        await http.serve()
    finally:
        if beat is not None:
            beat.cancel()
        await server.stop(grace=1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m enclave_worker.grpc_server")
    parser.add_argument("--broker-url", required=True)
    parser.add_argument("--package-dir", type=Path, required=True)
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--tee", default="sim",
                        help="sim | snp | tdx | auto, optionally +nvgpu (GPUs in CC mode), e.g. snp+nvgpu")
    parser.add_argument("--tsm-dir", type=Path, default=Path("/sys/kernel/config/tsm/report"),
                        help="configfs-tsm report directory")
    parser.add_argument("--tsm-entry", default=None, help="use this existing configfs-tsm entry")
    parser.add_argument("--sev-guest-device", type=Path, default=Path("/dev/sev-guest"))
    parser.add_argument("--ccel-table", type=Path, default=Path("/sys/firmware/acpi/tables/CCEL"),
                        help="ACPI CCEL table (TDX CC event log)")
    parser.add_argument("--ccel-data", type=Path, default=Path("/sys/firmware/acpi/tables/data/CCEL"))
    parser.add_argument("--sim-platform-key", type=Path, default=os.environ.get("SEALED_SIM_PLATFORM_KEY") or None,
                        help="simulated TEE's key (dev; default $SEALED_SIM_PLATFORM_KEY)")
    parser.add_argument("--unsafe-sim-measurement", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--advertise-host", default=None,
                        help="address announced to the gateway (default --host; in a pod: its IP)")
    parser.add_argument("--port", type=int, default=8002)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--register-url", action="append", default=[], help="gateway to send heartbeats to")
    parser.add_argument("--register-token-file", type=Path, default=None)
    parser.add_argument("--gateway-client-cert", type=Path, default=None,
                        help="serve gRPC over mutual TLS, accepting only this gateway certificate")
    parser.add_argument("--policy-file", type=Path, default=None, help="the tenant's signed policy set")
    parser.add_argument("--policy-admin-key", type=Path, default=None, help="tenant admin key that signed it")
    parser.add_argument("--unsafe-no-tenant-policy", action="store_true",
                        help="run without data and tool-use controls (logs a warning)")
    parser.add_argument("--lease-seconds", type=float, default=60.0,
                        help="serve at most this long without a key lease renewal (measured)")
    parser.add_argument("--lease-watch-seconds", type=float, default=20.0,
                        help="how long one lease renewal is held open at the broker")
    parser.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu",
                        help="where the engine runs; auto = cuda when a CUDA device is visible")
    parser.add_argument("--dtype", default=None, help="engine dtype (default: bfloat16 on cuda, float32 on cpu)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                        help="share of GPU memory for weights, KV pool and activations")
    parser.add_argument("--engine", choices=("sealed", "vllm"), default="sealed",
                        help="the inference engine (measured); vllm needs vLLM installed in this interpreter")
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None,
                        help="tokens per engine step (default: 512 on the CPU, 2048 on a GPU)")
    parser.add_argument("--max-model-len", type=int, default=2048)
    args = parser.parse_args(argv)
    try:
        tee, gpu_tee = resolve_tee(args.tee)
    except UnsupportedError as exc:
        parser.error(str(exc))
    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per heartbeat otherwise
    settings = WorkerSettings(
        broker_url=args.broker_url, package_dir=args.package_dir, tenant=args.tenant, model=args.model,
        version=args.version, tee=tee, gpu_tee=gpu_tee, device=device, engine_dtype=args.dtype,
        gpu_memory_utilization=args.gpu_memory_utilization, tsm_dir=args.tsm_dir, tsm_entry=args.tsm_entry,
        sev_guest_device=args.sev_guest_device, ccel_table=args.ccel_table, ccel_data=args.ccel_data,
        sim_platform_key=args.sim_platform_key,
        unsafe_sim_measurement=args.unsafe_sim_measurement, host=args.host, port=args.port,
        engine=args.engine, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
        policy_file=args.policy_file,
        policy_admin_key=args.policy_admin_key, unsafe_no_tenant_policy=args.unsafe_no_tenant_policy,
        lease_s=args.lease_seconds, lease_watch_s=args.lease_watch_seconds)
    token = args.register_token_file.read_text().strip() if args.register_token_file else ""
    client_cert = args.gateway_client_cert.read_bytes() if args.gateway_client_cert else None
    if settings.engine != "vllm" and device == "cpu":
        from enclave_worker.engine.errors import CpuKernelsUnavailable
        from enclave_worker.engine.kernels.cpu_ops import load_cpu_ops
        from enclave_worker.engine.threads import single_threaded_caller

        try:  # before anything is attested or fetched: the CPU kernels were built at install time, or it stops here
            load_cpu_ops()
        except CpuKernelsUnavailable as exc:
            print(f"worker: {exc}", file=sys.stderr, flush=True)
            return 3
        single_threaded_caller()  # the engine's own thread is the one that computes in parallel
    freeze_startup_heap()  # before any key or weight exists: full GC passes scan only what serving creates
    schedule_full_collections()  # and run on a timer, not every few seconds under load
    asyncio.run(serve(settings, args.grpc_port, args.register_url, token, client_cert, args.advertise_host))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
