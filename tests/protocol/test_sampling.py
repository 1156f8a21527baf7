"""One SamplingParams contract for gateway, wire and engine, and one max_tokens default rule."""

from __future__ import annotations

import pytest

from enclave_worker.engine import SamplingParams as EngineSamplingParams
from protocol.openai.chat import plan_chat
from protocol.openai.completions import plan_completion
from protocol.openai.errors import OpenAIError
from protocol.openai.runner import sampling_params
from protocol.openai.schemas import ChatCompletionRequest, CompletionRequest
from protocol.rpc import worker_pb2
from protocol.rpc.sampling import from_wire, to_wire
from protocol.sampling import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    DEFAULT_MAX_TOKENS,
    InvalidSamplingParams,
    SamplingParams,
    StructuredOutput,
    resolve_max_tokens,
)


def test_the_engine_uses_the_protocol_class() -> None:
    assert EngineSamplingParams is SamplingParams


def test_the_wire_round_trips_every_field() -> None:
    params = SamplingParams(max_tokens=7, temperature=0.5, top_p=0.25, top_k=3, seed=-(1 << 63),
                            stop=("a", "bc"), stop_token_ids=(1, 2), logprobs=0, ignore_eos=True,
                            presence_penalty=-1.5, frequency_penalty=0.75, repetition_penalty=1.25, min_p=0.125,
                            logit_bias=((3, -100.0), (70000, 2.5)),
                            structured=StructuredOutput("json_schema", '{"type": "object"}'))
    assert from_wire(worker_pb2.SamplingParams.FromString(to_wire(params).SerializeToString())) == params
    assert from_wire(to_wire(SamplingParams(seed=None, logprobs=None))) == SamplingParams()


def test_a_message_without_max_tokens_gets_the_one_default() -> None:
    assert from_wire(worker_pb2.SamplingParams(temperature=1.0)).max_tokens == DEFAULT_MAX_TOKENS
    assert SamplingParams().max_tokens == DEFAULT_MAX_TOKENS


def test_bad_values_from_the_wire_are_refused() -> None:
    with pytest.raises(InvalidSamplingParams):
        from_wire(worker_pb2.SamplingParams(max_tokens=4, temperature=-1.0))


def test_the_max_tokens_rule() -> None:
    assert resolve_max_tokens(None, "chat") == DEFAULT_MAX_TOKENS == 256
    assert resolve_max_tokens(None, "chat", 64) == 64
    assert resolve_max_tokens(None, "completions") == COMPLETIONS_DEFAULT_MAX_TOKENS == 16
    assert resolve_max_tokens(9, "chat") == resolve_max_tokens(9, "completions") == 9


def test_the_openai_layer_applies_it() -> None:
    chat = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    plan = plan_chat(chat, rid="r", tenant="t", key_id="k", agent_killed=False, default_max_tokens=100)
    assert plan.requests[0].params.max_tokens == 100
    capped = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                   "max_tokens": 50, "max_completion_tokens": 5})
    plan = plan_chat(capped, rid="r", tenant="t", key_id="k", agent_killed=False, default_max_tokens=100)
    assert plan.requests[0].params.max_tokens == 5
    legacy = CompletionRequest.model_validate({"model": "m", "prompt": "hi"})
    assert plan_completion(legacy, rid="r", tenant="t", key_id="k").requests[0].params.max_tokens == 16


def test_a_request_the_engine_would_refuse_is_refused_by_the_gateway_as_a_400() -> None:
    chat = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                 "top_logprobs": 20, "logprobs": True})
    plan_chat(chat, rid="r", tenant="t", key_id="k", agent_killed=False, default_max_tokens=8)
    with pytest.raises(OpenAIError) as err:
        sampling_params(chat, 8, 21, [], 0)
    assert err.value.status == 400
