"""POST /v1/completions: plan the choices, then render their chunks as OpenAI answers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from protocol.openai import format as fmt
from protocol.openai.constraints import guided_constraint
from protocol.openai.errors import OpenAIError, error_body
from protocol.openai.runner import (
    SSE_DONE,
    ChoiceRunner,
    ChunkEncoder,
    Streams,
    check_stream_options,
    sampling_params,
    sse,
    usage_of,
)
from protocol.openai.schemas import CompletionRequest
from protocol.rpc import worker_pb2
from protocol.sampling import resolve_max_tokens


@dataclass(frozen=True)
class CompletionPlan:
    requests: list[worker_pb2.GenerateRequest]
    prompts: list[str]
    affinity: str
    reserve_chars: int

    def echo(self, req: CompletionRequest, i: int) -> str:
        return self.prompts[i // req.n] if req.echo else ""


def plan_completion(req: CompletionRequest, *, rid: str, tenant: str, key_id: str) -> CompletionPlan:
    check_stream_options(req)
    prompts = [req.prompt] if isinstance(req.prompt, str) else list(req.prompt)
    if not prompts or any(not p for p in prompts):
        raise OpenAIError(400, "prompt must not be empty", param="prompt")
    max_tokens = resolve_max_tokens(req.max_tokens, "completions")
    structured = guided_constraint(req)
    requests = [worker_pb2.GenerateRequest(
        request_id=f"{rid}-{pi}-{j}", tenant=tenant, key_id=key_id, kind="completion", prompt=prompt,
        params=sampling_params(req, max_tokens, req.logprobs, [], j, structured)) for pi, prompt in enumerate(prompts)
        for j in range(req.n)]
    return CompletionPlan(requests=requests, prompts=prompts, affinity=prompts[0][:4096],
                          reserve_chars=sum(map(len, prompts)))


async def completion_body(req: CompletionRequest, plan: CompletionPlan, run: ChoiceRunner, streams: Streams,
                          base: dict[str, Any]) -> dict[str, Any]:
    results = await run.collect(streams)
    choices = [{"index": i, "text": plan.echo(req, i) + r.text, "finish_reason": r.finish_reason,
                "logprobs": fmt.completion_logprobs(r.logprobs, len(plan.echo(req, i))) if req.logprobs is not None
                else None} for i, r in enumerate(results)]
    usage = usage_of(results)
    usage["prompt_tokens"] = sum({i // req.n: r.prompt_tokens for i, r in enumerate(results)}.values())
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return {**base, "choices": choices, "usage": usage}


async def completion_events(req: CompletionRequest, plan: CompletionPlan, run: ChoiceRunner, streams: Streams,
                            base: dict[str, Any]) -> AsyncIterator[bytes]:
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    results, started = [worker_pb2.GenerateChunk()] * len(plan.requests), set()
    encode = ChunkEncoder(base)
    try:
        async for i, out in run.merged(streams):
            results[i] = out
            text = out.text if i in started else plan.echo(req, i) + out.text
            started.add(i)
            lp = fmt.completion_logprobs(list(out.logprobs)) if req.logprobs is not None else None
            yield encode({"index": i, "text": text, "logprobs": lp, "finish_reason": out.finish_reason or None})
    except OpenAIError as exc:
        yield sse(error_body(exc.message, exc.type, exc.code))
        return
    finally:
        await run.close()
    if include_usage:
        yield sse({**base, "choices": [], "usage": usage_of(results)})
    yield SSE_DONE
