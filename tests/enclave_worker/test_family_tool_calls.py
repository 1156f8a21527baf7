"""Each family's tool calls end to end through the worker (issue #48): a stand-in engine answers a
fixed token sequence in the family's own syntax (its marker a special token the detokenizer drops,
as in the real tokenizers), the real servicer serves it over real gRPC, and the OpenAI layer the
gateway runs turns it into an answer. The official openai SDK's types read both answers: the
accumulated stream is the non-streamed message, calls and content. A malformed call fails the
answer with a clear error (the gateway's 500 `invalid_tool_call`), never text."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from api.gateway.grpc_client import _translate
from enclave_worker.guard import WorkerGuard
from policy.policyset import PolicySet
from protocol.openai.chat import chat_body, chat_events, plan_chat
from protocol.openai.runner import ChoiceResult, Streams, collect_choice, merge_streams
from protocol.openai.schemas import ChatCompletionRequest
from protocol.rpc import worker_pb2
from protocol.sealed import RequestContext, seal_request
from protocol.sealed.http import ResponseHead
from tests.enclave_worker.tool_families import ScriptedEngine, family_tokenizer
from tests.security.sealed_harness import Stack, sealed_stack

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "Weather in Paris and Lyon?"}]
PARIS, LYON = ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Lyon"})

# (family, what the model says (its special tokens among it), the content, the calls)
ANSWERS = [
    ("hermes", 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call><|im_end|>',
     "Checking.", [PARIS, LYON]),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
                    '{"name": "get_weather", "parameters": {"city": "Lyon"}}<|eot_id|>', None, [PARIS, LYON]),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}<|eom_id|>',
     None, [PARIS]),
    ("mistral", 'Checking. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                '{"name": "get_weather", "arguments": {"city": "Lyon"}}]</s>', "Checking.", [PARIS, LYON]),
    ("mistral", "Paris is sunny.</s>", "Paris is sunny.", []),
    ("mistral_v11", 'Checking. [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_weather[ARGS]'
                    '{"city": "Lyon"}</s>', "Checking.", [PARIS, LYON]),
    ("mistral_v11", "Paris is sunny.</s>", "Paris is sunny.", []),
]
MALFORMED = [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', "length", "cut off"),
    ("hermes", '<tool_call>\n{"name": get_weather}\n</tool_call><|im_end|>', "stop", "not valid JSON"),
    ("hermes", '<tool_call>\n{"name": "delete_files", "arguments": {}}\n</tool_call><|im_end|>', "stop",
     "not one of the request"),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Par', "length", "cut off"),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {city: Paris}}]</s>', "stop", "not valid JSON"),
    ("mistral", '[TOOL_CALLS][{"name": "delete_files", "arguments": {}}]</s>', "stop", "not one of the request"),
    ("mistral_v11", '[TOOL_CALLS]get_weather[ARGS]{"city": "Par', "length", "cut off"),
    ("mistral_v11", "[TOOL_CALLS]get_wea", "length", "cut off"),
    ("mistral_v11", '[TOOL_CALLS]get_weather[ARGS]{city: Paris}</s>', "stop", "not valid JSON"),
    ("mistral_v11", '[TOOL_CALLS]delete_files[ARGS]{}</s>', "stop", "not one of the request"),
    ("mistral_v11", '[TOOL_CALLS][{"name": "get_weather", "arguments": {}}]</s>', "stop", "no function name"),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Par', "length", "cut off"),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city" "Paris"}}<|eot_id|>', "stop", "not valid JSON"),
    ("llama3_json", '<|python_tag|>{"name": "rm_rf", "parameters": {}}<|eom_id|>', "stop", "not one of the request"),
]


class GrpcRun:
    """The gateway's side of a run, reduced to reading the worker's streams."""

    async def collect(self, streams: Streams) -> list[ChoiceResult]:
        return [await collect_choice(s, lambda chunk: None) for s in streams]

    def merged(self, streams: Streams) -> AsyncIterator[tuple[int, worker_pb2.GenerateChunk]]:
        return merge_streams(streams)

    async def close(self) -> None:
        return None


def _engine(family: str, said: str, finish: str = "stop") -> ScriptedEngine:
    tok = family_tokenizer(family)
    eos = set(tok.eos_token_ids) | set(tok.encode("<|eom_id|>"))
    ids = tok.encode(said)
    # The engine stops at an end token and does not detokenize it (it is special anyway).
    return ScriptedEngine(tok, ids, finish if not ids or ids[-1] not in eos else "stop")


async def _answer(stack: Stack, body: dict[str, Any]) -> tuple[ChatCompletion, ChatCompletion]:
    """The answer not streamed, and the streamed one as the openai SDK accumulates it."""
    req = ChatCompletionRequest.model_validate(body)
    plan = plan_chat(req, rid="r1", tenant="acme", key_id=stack.key.key_id, agent_killed=False,
                     default_max_tokens=64)
    base = {"id": "chatcmpl-r1", "created": 0, "model": "m"}
    whole = await chat_body(req, plan, GrpcRun(), [stack.stub.Generate(r) for r in plan.requests], base)
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState(input_tools=body.get("tools", []))
    streamed = stream_plan = plan_chat(req.model_copy(update={"stream": True}), rid="r2", tenant="acme",
                                       key_id=stack.key.key_id, agent_killed=False, default_max_tokens=64)
    async for event in chat_events(req, stream_plan, GrpcRun(), [stack.stub.Generate(r) for r in streamed.requests],
                                   base):
        data = event.decode().removeprefix("data: ").strip()
        if data != "[DONE]":
            state.handle_chunk(ChatCompletionChunk.model_validate(json.loads(data)))
    return ChatCompletion.model_validate(whole), state.current_completion_snapshot


def _agent_guard(key_id: str) -> WorkerGuard:
    """A policy that allows get_weather (its arguments checked by a schema: judged whole) and nothing else."""
    return WorkerGuard(PolicySet.from_dict({"policy_id": "p", "version": 1, "tenant": "acme",
                                            "data": {"pii_input": {"US_SSN": "block"}}, "agents": {
        key_id: {"tools": {"get_weather": {"args_schema": WEATHER["function"]["parameters"]}},
                 "max_calls_per_request": 4, "max_calls_per_session": 100}}}))


def no_guard(key_id: str) -> None:
    """No tenant policy: the family's calls as the model made them."""
    return None


def _calls(completion: Any) -> list[tuple[str, Any]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in completion.choices[0].message.tool_calls or []]


@pytest.mark.parametrize(("family", "said", "content", "calls"), ANSWERS)
@pytest.mark.parametrize("guarded", [False, True], ids=["no-policy", "tenant-policy"])
async def test_a_familys_calls_are_openai_tool_calls_streamed_or_not(
        tmp_path: Path, family: str, said: str, content: str | None, calls: list[tuple[str, Any]],
        guarded: bool) -> None:
    engine = _engine(family, said)
    # The tenant's tool-use controls judge each call (enclave_worker/tool_stream.py), or none apply.
    async with sealed_stack(tmp_path, None, engine,  # type: ignore[arg-type]
                            lambda key_id: _agent_guard(key_id) if guarded else None) as stack:
        whole, streamed = await _answer(stack, {"model": "m", "messages": ASK, "tools": [WEATHER]})
        # Recorded with the model: the worker's status (heartbeat, /internal/status) names its syntax.
        assert stack.state.report().tool_call_syntax == family
    assert _calls(whole) == calls
    assert _calls(streamed) == calls
    assert whole.choices[0].message.content == streamed.choices[0].message.content == content
    assert whole.choices[0].finish_reason == streamed.choices[0].finish_reason == ("tool_calls" if calls else "stop")
    # The prompt the engine ran was the family's own template with the tool in it.
    prompt = engine.tokenizer.decode(engine.prompts[0], skip_special_tokens=False)
    assert '"name": "get_weather"' in prompt and "Weather in Paris and Lyon?" in prompt


@pytest.mark.parametrize(("family", "said", "finish", "message"), MALFORMED)
async def test_a_malformed_call_is_a_clear_error_not_text(tmp_path: Path, family: str, said: str, finish: str,
                                                         message: str) -> None:
    """The worker's stream fails (streamed or not, the worker sends the same chunks; the sealed-mode
    test below shows the error as the OpenAI layer gives it)."""
    async with sealed_stack(tmp_path, None, _engine(family, said, finish), no_guard) as stack:  # type: ignore[arg-type]
        (request,) = plan_chat(ChatCompletionRequest.model_validate(
            {"model": "m", "messages": ASK, "tools": [WEATHER]}), rid="r", tenant="acme",
            key_id="k", agent_killed=False, default_max_tokens=64).requests
        texts = []
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for chunk in stack.stub.Generate(request):
                texts.append(chunk.text)
    assert caught.value.code() == grpc.StatusCode.DATA_LOSS
    assert message in (caught.value.details() or "")
    error = _translate(caught.value, started=True)  # what the gateway answers
    assert (error.status, error.code) == (500, "invalid_tool_call") and message in error.message
    # What left before the error is the start of a call block (the OpenAI layer holds it as a call,
    # never content), or nothing.
    assert "".join(texts).startswith("<tool_call>") or not "".join(texts)


@pytest.mark.parametrize("family", ["hermes", "llama3_json", "mistral", "mistral_v11"])
@pytest.mark.parametrize("choice", ["required", "named"])
async def test_a_forced_call_opens_and_is_constrained_in_the_familys_syntax(tmp_path: Path, family: str,
                                                                             choice: str) -> None:
    """The prompt ends with the family's own opening; the engine's constraint is the family's call;
    what the model writes after it reads, with the gateway's prefix, as one call."""
    rest = {("llama3_json", "required"): '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>',
            ("mistral", "required"): '{"name": "get_weather", "arguments": {"city": "Paris"}}</s>',
            ("hermes", "required"): '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
            ("hermes", "named"): '{"city": "Paris"}}',  # then the stop string </tool_call>
            ("mistral_v11", "required"): 'get_weather{"city": "Paris"}</s>',
            ("mistral_v11", "named"): '{"city": "Paris"}</s>',  # v11's arguments are not in an object
            }.get((family, choice), '{"city": "Paris"}}' + ("<|eot_id|>" if family == "llama3_json" else "</s>"))
    engine = _engine(family, rest)
    tool_choice: Any = "required" if choice == "required" else {"type": "function", "function": {"name": "get_weather"}}
    async with sealed_stack(tmp_path, None, engine, no_guard) as stack:  # type: ignore[arg-type]
        whole, streamed = await _answer(stack, {"model": "m", "messages": ASK, "tools": [WEATHER],
                                                "tool_choice": tool_choice})
    assert _calls(whole) == _calls(streamed) == [PARIS]
    prompt = engine.tokenizer.decode(engine.prompts[0], skip_special_tokens=False)
    opening = {("hermes", "required"): "<|im_start|>assistant\n<tool_call>\n",
               ("hermes", "named"): '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": ',
               ("llama3_json", "required"): "<|end_header_id|>\n\n",
               ("llama3_json", "named"): '{"name": "get_weather", "parameters": ',
               ("mistral", "required"): "[/INST][TOOL_CALLS][",
               ("mistral", "named"): '[/INST][TOOL_CALLS][{"name": "get_weather", "arguments": ',
               ("mistral_v11", "required"): "[/INST][TOOL_CALLS]",
               ("mistral_v11", "named"): "[/INST][TOOL_CALLS]get_weather[ARGS]"}[(family, choice)]
    assert prompt.endswith(opening)
    structured = engine.params[0].structured
    assert structured is not None
    if family == "mistral_v11":  # a grammar of v11 calls (test_tool_syntax.py checks what it allows)
        assert structured.kind == "lark" and ("get_weather" in structured.spec) == (choice == "required")
    elif choice == "required":
        schema = json.loads(structured.spec)
        key = "parameters" if family == "llama3_json" else "arguments"
        assert set(schema["properties"]) == {"name", key} and key in schema["required"]


async def _sealed(stack: Stack, body: dict[str, Any]) -> tuple[int, list[bytes]]:
    """A sealed request (the OpenAI layer runs in the worker): its status and body pieces."""
    key = stack.state.serving_key
    ctx = RequestContext("acme", "m", "/v1/chat/completions", key.key_id, version="v1", api_key_id=stack.key.key_id,
                         policy_version=0)
    sealed = seal_request(key.public_bytes, ctx, json.dumps(body).encode(), time.time())
    request = worker_pb2.SealedRequest(request_id="rs1", tenant="acme", key_id=stack.key.key_id, model="m",
                                       endpoint="/v1/chat/completions", worker_key_id=key.key_id, body=sealed.wire)
    plain: list[bytes] = []
    async for chunk in stack.service.sealed_stream(stack.key, "m", request):
        plain += [p for p, _ in sealed.opener.feed(chunk.data)]
    return ResponseHead.decode(plain[0]).status, plain[1:]


async def test_sealed_mode_reads_the_familys_calls_in_the_worker(tmp_path: Path) -> None:
    """In sealed mode the OpenAI layer runs inside the worker: the same calls, and the same error."""
    body = {"model": "m", "messages": ASK, "tools": [WEATHER]}
    async with sealed_stack(tmp_path, None, _engine("mistral", ANSWERS[3][1]), no_guard) as stack:  # type: ignore[arg-type]
        status, pieces = await _sealed(stack, body)
    assert status == 200
    message = ChatCompletion.model_validate(json.loads(pieces[0])).choices[0].message
    assert _calls(SimpleNamespace(choices=[SimpleNamespace(message=message)])) == [PARIS, LYON]
    assert message.content == "Checking."
    (tmp_path / "bad").mkdir()
    async with sealed_stack(tmp_path / "bad", None,  # type: ignore[arg-type]
                            _engine("mistral", MALFORMED[5][1], MALFORMED[5][2]), no_guard) as stack:
        status, pieces = await _sealed(stack, body)
    error = json.loads(pieces[0])["error"]
    assert (status, error["code"], error["type"]) == (500, "invalid_tool_call", "server_error")
    assert "not one of the request's tools" in error["message"]


@pytest.mark.parametrize("family", ["llama3_json", "mistral", "mistral_v11"])
async def test_the_tenants_tool_controls_judge_the_familys_calls(tmp_path: Path, family: str) -> None:
    """The guard reads the rewritten answer: a tool the policy does not allow is refused (403, the
    signed decision in the trailers) before any byte of its call leaves, whatever the family's syntax."""
    said = {"llama3_json": '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>',
            "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]</s>',
            "mistral_v11": '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}</s>'}[family]

    def get_time_only(key_id: str) -> WorkerGuard:
        return WorkerGuard(PolicySet.from_dict({
            "policy_id": "p", "version": 1, "tenant": "acme", "data": {"pii_input": {"US_SSN": "block"}},
            "agents": {key_id: {"tools": {"get_time": {}}}}}))

    async with sealed_stack(tmp_path, None, _engine(family, said), get_time_only) as stack:  # type: ignore[arg-type]
        (request,) = plan_chat(ChatCompletionRequest.model_validate(
            {"model": "m", "messages": ASK, "tools": [WEATHER]}), rid="r", tenant="acme",
            key_id=stack.key.key_id, agent_killed=False, default_max_tokens=64).requests
        texts = []
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for chunk in stack.stub.Generate(request):
                texts.append(chunk.text)
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "get_weather" in (caught.value.details() or "") and "get_weather" not in "".join(texts)
