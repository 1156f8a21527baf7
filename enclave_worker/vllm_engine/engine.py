"""VllmEngine: vLLM behind the same interface as our LLMEngine (enclave_worker/engine_protocol.py).

vLLM generates token ids only (``skip_tokenizer_init``): prompts are rendered and tokenized by
the worker as for our engine, and each sampled token goes through our own OutputProcessor, so
stop strings, stop ids, EOS, streamed text and logprobs behave exactly as with our engine. vLLM
is told to stop on the same ids (EOS and stop ids) and at the same max_tokens; when a stop string
ends a request first, the vLLM request is aborted.

The engine core runs in this process (vLLM's ``LLMEngine`` with multiprocessing off), stepped by
one background thread; requests and aborts are queued to that thread, since vLLM's scheduler is
not thread-safe. AsyncLLM always starts its engine core in another process, which would need the
plaintext weights or the data key to cross a process boundary: docs/vllm-backend.md.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from enclave_worker.engine.compute_thread import ComputeThread
from enclave_worker.engine.config import RequestOutput, SamplingParams, TokenLogprob
from enclave_worker.engine.engine_thread import ThreadedEngine
from enclave_worker.engine.errors import InvalidRequestError
from enclave_worker.engine.output_processor import OutputProcessor
from enclave_worker.engine.output_stream import Sink
from enclave_worker.engine.sequence import SeqStatus, Sequence
from enclave_worker.engine.tokenizer import Tokenizer

from .runtime import VllmRuntime
from .structured import vllm_structured


@dataclass
class _Request:
    seq: Sequence
    sink: Sink
    vllm_id: str = ""
    cached_tokens: int | None = None


@dataclass
class _Ops:
    add: list[tuple[_Request, object, object]] = field(default_factory=list)
    abort: list[str] = field(default_factory=list)


def vllm_sampling_kwargs(params: SamplingParams, max_tokens: int, eos_ids: tuple[int, ...]) -> dict[str, Any]:
    """Our sampling parameters as vLLM's SamplingParams arguments: EOS handled through stop ids,
    text left to us; penalties, logit_bias and min_p are vLLM's own (ours copy their semantics).
    A constrained request always stops on EOS: once its grammar is complete, EOS is the only token
    vLLM's mask allows (our engine ends such a request there without sampling it, ignore_eos or not)."""
    eos_stops = not params.ignore_eos or params.structured is not None
    stop_ids = list(params.stop_token_ids) + ([t for t in eos_ids if t not in params.stop_token_ids]
                                              if eos_stops else [])
    return {"n": 1, "max_tokens": max_tokens, "temperature": params.temperature, "top_p": params.top_p,
            "top_k": params.top_k or 0, "seed": params.seed, "stop_token_ids": stop_ids, "ignore_eos": True,
            "logprobs": params.logprobs, "detokenize": False, "skip_special_tokens": False,
            "presence_penalty": params.presence_penalty, "frequency_penalty": params.frequency_penalty,
            "repetition_penalty": params.repetition_penalty, "min_p": params.min_p,
            "logit_bias": dict(params.logit_bias) or None}


def vllm_sampling(params: SamplingParams, max_tokens: int, eos_ids: tuple[int, ...]):  # type: ignore[no-untyped-def]
    from vllm import SamplingParams as VSamplingParams
    from vllm.sampling_params import RequestOutputKind

    structured = None if params.structured is None else vllm_structured(params.structured)
    return VSamplingParams(**vllm_sampling_kwargs(params, max_tokens, eos_ids), output_kind=RequestOutputKind.DELTA,
                           structured_outputs=structured)


def _records(logprobs: list[Any] | None, count: int | None) -> list[TokenLogprob | None]:
    if count is None or not logprobs:
        return []
    out: list[TokenLogprob | None] = []
    for sampled, entries in logprobs:
        ranked = sorted(entries.items(), key=lambda kv: kv[1].rank)
        top = tuple((tid, float(lp.logprob)) for tid, lp in ranked if lp.rank is not None and lp.rank <= count)
        out.append(TokenLogprob(sampled, float(entries[sampled].logprob), top[:count]))
    return out


# vLLM's own metrics (a Prometheus snapshot: every histogram's buckets formatted, ~3 ms of Python
# when idle) are read at most this often. The worker's status is asked far more often (the gateway's
# delivery probe sends a Status RPC every 50 ms), and that Python ran on the event loop's thread,
# holding the GIL the stepping thread needs between vLLM's torch ops: the stepping thread waited on
# the GIL for ~26% of a loaded run (docs/vllm-backend.md, "Threads"). The heartbeat sends them once a
# second, Prometheus scrapes them less often.
METRICS_MAX_AGE_S = 1.0


class VllmEngine(ThreadedEngine[_Request]):
    thread_name = "vllm-engine"

    def __init__(self, runtime: VllmRuntime, tokenizer: Tokenizer, compute: ComputeThread | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(compute)
        self._clock = clock
        self._metrics: tuple[float, dict[str, float]] | None = None  # (read at, vLLM's metrics)
        self.runtime = runtime
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size
        self.max_model_len = runtime.max_model_len
        self.output = OutputProcessor(tokenizer)
        self._by_vllm: dict[str, _Request] = {}
        self._ops = _Ops()
        self.prefix_cached_tokens = 0
        self.prefix_queried_tokens = 0
        runtime.enable_structured(tokenizer)

    @classmethod
    def on_compute_thread(cls, make_runtime: Callable[[], VllmRuntime], tokenizer: Tokenizer) -> VllmEngine:
        """vLLM built (its CPU worker's OpenMP team bound, its warm-up run) on the thread that then
        steps it, as our engine is (compute_thread.py). Built on the boot's thread and stepped on
        another, the process kept two OpenMP teams on two cores and each decode step waited on the
        idle one: docs/vllm-backend.md, "Threads"."""
        compute = ComputeThread(cls.thread_name)
        try:
            engine = compute.call(lambda: cls(make_runtime(), tokenizer, compute))
        except BaseException:
            compute.close()
            raise
        weakref.finalize(engine, compute.close)  # dropped without shutdown(): the idle thread ends
        return engine

    def validate(self, request_id: str, prompt: list[int], params: SamplingParams, cache_salt: bytes) -> None:
        """As our engine's, and: a constraint vLLM's guidance backend cannot build is refused here
        (400), in the caller's thread, never on the stepping thread where vLLM would fail it later."""
        super().validate(request_id, prompt, params, cache_salt)
        if params.structured is not None:
            self.runtime.check_structured(params.structured)

    def held_tensors(self) -> list:  # type: ignore[type-arg]
        return self.runtime.held_tensors()

    def wipe(self) -> None:
        """Zero vLLM's weights and KV cache in place (revocation); frees them on shutdown."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=60)
        self.runtime.wipe()

    # ------------------------------------------------------------ requests

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, sink: Sink,
                    cache_salt: bytes = b"") -> None:
        prompt = list(prompt_token_ids)
        self.validate(request_id, prompt, params, cache_salt)
        max_tokens = min(params.max_tokens, self.max_model_len - len(prompt))
        vparams = vllm_sampling(params, max_tokens, self.tokenizer.eos_token_ids)
        # The salt is derived in the worker per tenant (WorkerState.cache_salt): vLLM hashes it into
        # the request's first prefix-cache block, so tenants never share a cached block.
        inputs = {"prompt_token_ids": prompt, **({"cache_salt": cache_salt.hex()} if cache_salt else {})}

        def make(seq_id: int) -> _Request:
            req = _Request(Sequence(seq_id, request_id, prompt, len(prompt), params, max_tokens, cache_salt), sink)
            self._ops.add.append((req, inputs, vparams))  # handed to vLLM by the stepping thread
            return req

        self._submit(request_id, make)

    def _release(self, req: _Request, reason: str) -> None:
        """Under the lock: mark finished and have vLLM drop the request (and its KV blocks)."""
        req.seq.status, req.seq.finish_reason = SeqStatus.FINISHED, reason
        if req.vllm_id:
            self._by_vllm.pop(req.vllm_id, None)
            self._ops.abort.append(req.vllm_id)
        else:  # not yet handed to vLLM
            self._ops.add = [op for op in self._ops.add if op[0] is not req]
        self._cond.notify()

    # ------------------------------------------------------------ stepping

    def _apply_ops(self) -> None:
        with self._cond:
            adds, aborts = self._ops.add, self._ops.abort
            self._ops = _Ops()
        if aborts:
            self.runtime.llm.abort_request(aborts)
        for req, inputs, vparams in adds:
            # vLLM makes its own internal id; its outputs and abort_request use ours (the external id).
            try:
                self.runtime.llm.add_request(req.seq.request_id, inputs, vparams)
            except self.runtime.request_errors as exc:  # vLLM refused this request alone
                with self._cond:
                    ours = self._requests.pop(req.seq.request_id, None) is req  # not aborted meanwhile
                    req.seq.status, req.seq.finish_reason = SeqStatus.FINISHED, "abort"
                if ours:
                    req.sink(InvalidRequestError(f"vLLM refused the request ({type(exc).__name__})"))
                continue
            vid = req.seq.request_id
            with self._cond:
                req.vllm_id = vid
                if req.seq.is_finished:  # aborted while it was being added
                    self._ops.abort.append(vid)
                else:
                    self._by_vllm[vid] = req

    def step(self) -> list[RequestOutput]:
        self._apply_ops()
        outputs = self.runtime.llm.step()
        delivered: list[tuple[Sink, RequestOutput | BaseException]] = []
        with self._cond:
            for out in outputs:
                req = self._by_vllm.get(out.request_id)
                if req is None or req.seq.is_finished:
                    continue
                if req.cached_tokens is None and out.num_cached_tokens is not None:
                    req.cached_tokens = out.num_cached_tokens
                    self.prefix_cached_tokens += out.num_cached_tokens
                    self.prefix_queried_tokens += req.seq.num_prompt_tokens
                delivered += self._absorb(req, out)
        for sink, item in delivered:
            sink(item)
        return [item for _, item in delivered if isinstance(item, RequestOutput)]

    def _absorb(self, req: _Request, out) -> list[tuple[Sink, RequestOutput | BaseException]]:  # type: ignore[no-untyped-def]
        seq = req.seq
        completion = out.outputs[0]
        tokens = list(completion.token_ids)
        records = _records(completion.logprobs and list(zip(tokens, completion.logprobs, strict=True)),
                           seq.params.logprobs)
        reason = None
        for i, tok in enumerate(tokens):
            reason = self.output.append(seq, tok, records[i] if records else None, self.tokenizer.eos_token_ids)
            if reason is not None:
                break
        if reason is None and out.finished and completion.finish_reason == "error":
            # vLLM failed this request alone (a grammar it could not compile, or a token its grammar
            # refused): the request's error, by type only, never an answer cut short as if complete.
            del self._requests[seq.request_id]
            self._release(req, "abort")
            self._ops.abort = [a for a in self._ops.abort if a != req.vllm_id]
            return [(req.sink, InvalidRequestError("vLLM could not enforce this request's structured output"))]
        if reason is None and out.finished:
            reason = "length" if completion.finish_reason == "length" else (completion.finish_reason or "stop")
        if reason is not None:
            del self._requests[seq.request_id]
            self._release(req, reason)
            if out.finished:  # vLLM is done with it already: nothing to abort
                self._ops.abort = [a for a in self._ops.abort if a != req.vllm_id]
        if not tokens and reason is None:
            return []
        return [(req.sink, self.output.emit(seq))]

    def stats(self) -> dict[str, Any]:
        with self._cond:
            running = sum(1 for r in self._requests.values() if r.vllm_id)
            return {"num_running": running, "num_waiting": len(self._requests) - running,
                    "max_model_len": self.max_model_len, "block_size": self.runtime.block_size,
                    "prefix_cache_hit_tokens": self.prefix_cached_tokens,
                    "prefix_cache_query_tokens": self.prefix_queried_tokens,
                    **self.runtime.kv_stats(), **self._vllm_metrics()}

    def _vllm_metrics(self) -> dict[str, float]:
        """vLLM's metrics, read again once the last reading is METRICS_MAX_AGE_S old."""
        now, last = self._clock(), self._metrics
        if last is None or now - last[0] >= METRICS_MAX_AGE_S:
            last = self._metrics = (now, self.runtime.metrics())
        return last[1]

    def _has_work(self) -> bool:
        return bool(self._requests or self._ops.abort)

    def _loop(self) -> None:
        # As `vllm serve` threads its CPU worker (runtime.bind_stepping_thread), before the first step.
        self.runtime.bind_stepping_thread()
        super()._loop()

    def _closed(self) -> None:
        self.runtime.close()
