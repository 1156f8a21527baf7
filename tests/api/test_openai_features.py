"""The OpenAI surface beyond the basics, through the official client: n, seed, stop, logprobs,
tools and tool_choice, JSON mode, usage, metrics, and cancellation reaching the engine."""

from __future__ import annotations

import json
import time
from typing import Any as RunningStack

import httpx
import jsonschema
import openai
import pytest

from api.stack import DEMO_MODEL

Q = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def client(stack: RunningStack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.api_key, max_retries=0, timeout=120)


def test_n_seed_and_stop(stack: RunningStack) -> None:
    c = client(stack)
    a = c.chat.completions.create(model=DEMO_MODEL, messages=Q, n=2, seed=7, temperature=1.0, max_tokens=12)
    b = c.chat.completions.create(model=DEMO_MODEL, messages=Q, n=2, seed=7, temperature=1.0, max_tokens=12)
    assert [ch.index for ch in a.choices] == [0, 1]
    assert [ch.message.content for ch in a.choices] == [ch.message.content for ch in b.choices]
    assert a.usage.completion_tokens > 0
    stopped = c.chat.completions.create(model=DEMO_MODEL, messages=Q, temperature=0, max_tokens=32, stop=["Paris"])
    assert "Paris" not in stopped.choices[0].message.content
    assert stopped.choices[0].finish_reason == "stop"


def test_chat_logprobs_streaming_and_not(stack: RunningStack) -> None:
    c = client(stack)
    r = c.chat.completions.create(model=DEMO_MODEL, messages=Q, temperature=0, max_completion_tokens=5,
                                  logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in content)
    assert "".join(t.token for t in content) == r.choices[0].message.content
    chunks = list(c.chat.completions.create(model=DEMO_MODEL, messages=Q, temperature=0, max_tokens=5,
                                            logprobs=True, top_logprobs=2, stream=True))
    streamed = [t for ch in chunks if ch.choices and ch.choices[0].logprobs for t in ch.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in content]


def test_completions_logprobs_echo_and_streaming_usage(stack: RunningStack) -> None:
    c = client(stack)
    r = c.completions.create(model=DEMO_MODEL, prompt="The capital of France is", max_tokens=4, temperature=0,
                             logprobs=2, echo=True)
    assert r.choices[0].text.startswith("The capital of France is")
    assert len(r.choices[0].logprobs.tokens) == r.usage.completion_tokens
    chunks = list(c.completions.create(model=DEMO_MODEL, prompt=["Hello", "One, two,"], n=1, max_tokens=3,
                                       temperature=0, stream=True, stream_options={"include_usage": True}))
    assert {ch.choices[0].index for ch in chunks if ch.choices} == {0, 1}
    assert chunks[-1].usage.completion_tokens > 0


def test_forced_tool_call_is_parsed_into_tool_calls(stack: RunningStack) -> None:
    c = client(stack)
    messages = [{"role": "user", "content": "What's the weather like in Paris today?"}]
    r = c.chat.completions.create(model=DEMO_MODEL, messages=messages, tools=[WEATHER], temperature=0,
                                  max_tokens=40, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments), dict)
    # The round trip: the tool's answer goes back in, as the client SDK sends it.
    follow = c.chat.completions.create(model=DEMO_MODEL, temperature=0, max_tokens=16, tools=[WEATHER], messages=[
        *messages, choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 21}'}], tool_choice="none")
    assert follow.choices[0].message.content
    streamed = list(c.chat.completions.create(model=DEMO_MODEL, messages=messages, tools=[WEATHER], temperature=0,
                                              max_tokens=40, tool_choice="required", stream=True))
    calls = [tc for ch in streamed if ch.choices and ch.choices[0].delta.tool_calls
             for tc in ch.choices[0].delta.tool_calls]
    reasons = [ch.choices[0].finish_reason for ch in streamed if ch.choices and ch.choices[0].finish_reason]
    assert reasons == ["tool_calls"] and calls[0].function.name == "get_weather"


# The tool LangChain's with_structured_output(method="function_calling") sends.
CITY = {"type": "function", "function": {
    "name": "City", "description": "A city.", "parameters": {
        "type": "object", "properties": {"name": {"type": "string", "maxLength": 16}}, "required": ["name"]}}}


def test_the_demo_policy_lets_an_agent_frameworks_own_tools_run(stack: RunningStack) -> None:
    """The demo tenant's signed policy allows any tool name (any_tool), so a framework's default tools
    are answered rather than refused (403 default-deny) as when only get_weather was listed."""
    r = client(stack).chat.completions.create(
        model=DEMO_MODEL, temperature=0, max_tokens=32, tools=[CITY],
        tool_choice={"type": "function", "function": {"name": "City"}},
        messages=[{"role": "user", "content": "Which city is the capital of France?"}])
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "City" and isinstance(json.loads(call.function.arguments), dict)


def test_json_mode_returns_a_json_object(stack: RunningStack) -> None:
    r = client(stack).chat.completions.create(
        model=DEMO_MODEL, temperature=0, max_tokens=48, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "Give the name and country of the capital of France as JSON."}])
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # cut by max_tokens: returned as cut, never "repaired" into an object (an object must be whole)
        assert r.choices[0].finish_reason == "length" and r.choices[0].message.content.startswith("{")


PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                          "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                          "pet": {"enum": ["cat", "dog", "none"]}},
          "required": ["name", "age", "pet"], "additionalProperties": False}
FORECAST = {"type": "function", "function": {"name": "get_weather", "parameters": {  # the demo policy's one tool
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}


def test_json_schema_and_tool_arguments_are_enforced_while_decoding(stack: RunningStack) -> None:
    """Sampled at temperature 1, the answer follows the schema (the engine masks what would break
    it), streamed or not; a forced tool call names an offered tool and its arguments follow its schema."""
    c = client(stack)
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    msgs = [{"role": "user", "content": "Invent a person."}]
    for seed in (1, 2):
        r = c.chat.completions.create(model=DEMO_MODEL, messages=msgs, temperature=1.0, seed=seed, max_tokens=64,
                                      response_format=fmt)
        jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
        assert r.choices[0].finish_reason == "stop"
        chunks = list(c.chat.completions.create(model=DEMO_MODEL, messages=msgs, temperature=1.0, seed=seed,
                                                max_tokens=64, response_format=fmt, stream=True))
        pieces = [ch.choices[0].delta.content for ch in chunks if ch.choices and ch.choices[0].delta.content]
        assert len(pieces) > 1  # streamed as it is decoded, not held to the end
        jsonschema.validate(json.loads("".join(pieces)), PERSON)
    for seed, choice in ((3, "required"), (4, {"type": "function", "function": {"name": "get_weather"}})):
        r = c.chat.completions.create(model=DEMO_MODEL, messages=[{"role": "user", "content": "Weather, anywhere."}],
                                      tools=[FORECAST], tool_choice=choice, temperature=1.0, seed=seed, max_tokens=64)
        (call,) = r.choices[0].message.tool_calls
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), FORECAST["function"]["parameters"])


def test_usage_endpoint_and_metrics(stack: RunningStack) -> None:
    client(stack).chat.completions.create(model=DEMO_MODEL, messages=Q, temperature=0, max_tokens=4)
    usage = httpx.get(f"{stack.url}/v1/usage", headers={"Authorization": f"Bearer {stack.api_key}"}).json()
    assert usage["tenant"] == "demo" and usage["totals"]["requests"] >= 1
    assert usage["totals"]["completion_tokens"] > 0 and usage["totals"]["worker_seconds"] > 0
    from api.management.auth import issue_token

    operator = issue_token((stack.home / "gateway" / "jwt-secret").read_text().strip(), "test", "operator")
    text = httpx.get(f"{stack.url}/metrics", headers={"Authorization": f"Bearer {operator}"}).text
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
                 "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prompt_tokens_total",
                 "generation_tokens_total"):
        assert f"sealed:{name}" in text, name
    assert 'tenant="demo"' in text


def test_client_disconnect_cancels_the_request_in_the_engine(stack: RunningStack) -> None:
    body = {"model": DEMO_MODEL, "prompt": "Count: 1, 2, 3,", "max_tokens": 1500, "stream": True,
            "temperature": 0.8}
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    with httpx.stream("POST", f"{stack.url}/v1/completions", json=body, headers=headers, timeout=60) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 3:
                break
    worker_url = json.loads((stack.home / "run" / "pids.json").read_text())["worker_url"]
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        stats = httpx.get(f"{worker_url}/internal/status").json()["stats"]
        if stats["num_running"] == 0 and stats["num_waiting"] == 0:
            return
        time.sleep(0.2)
    raise AssertionError(f"the engine still runs the abandoned request: {stats}")


def test_worker_grpc_takes_only_the_gateways_mtls_certificate(stack: RunningStack) -> None:
    import grpc

    from api.management.auth import issue_token
    from protocol.rpc import worker_pb2, worker_pb2_grpc
    from protocol.tls import TARGET_NAME, make_identity

    token = issue_token((stack.home / "gateway" / "jwt-secret").read_text().strip(), "test", "operator")
    (worker,) = httpx.get(f"{stack.url}/admin/v1/workers", headers={"Authorization": f"Bearer {token}"}
                          ).json()["data"]
    assert worker["mtls"] is True

    def status(key_pem: bytes | None, cert_pem: bytes | None) -> str:
        creds = grpc.ssl_channel_credentials(root_certificates=worker["tls_cert"].encode(), private_key=key_pem,
                                             certificate_chain=cert_pem)
        with grpc.secure_channel(worker["grpc_address"], creds,
                                 options=[("grpc.ssl_target_name_override", TARGET_NAME)]) as channel:
            return worker_pb2_grpc.WorkerStub(channel).Status(worker_pb2.StatusRequest(), timeout=5).status

    gw = stack.home / "gateway"
    assert status((gw / "gateway-client.key").read_bytes(), (gw / "gateway-client.pem").read_bytes()) == "ready"
    stranger = make_identity("someone-else")
    for key_pem, cert_pem in ((stranger.key_pem, stranger.cert_pem), (None, None)):
        with pytest.raises(grpc.RpcError):
            status(key_pem, cert_pem)
    with pytest.raises(grpc.RpcError), grpc.insecure_channel(worker["grpc_address"]) as plain:
        worker_pb2_grpc.WorkerStub(plain).Status(worker_pb2.StatusRequest(), timeout=5)


def test_auto_tool_choice_streams_and_never_leaks_the_call_markup(stack: RunningStack) -> None:
    chunks = list(client(stack).chat.completions.create(
        model=DEMO_MODEL, tools=[WEATHER], temperature=0, max_tokens=48, stream=True,
        messages=[{"role": "user", "content": "What's the weather like in Paris today?"}]))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [tc for c in chunks if c.choices and c.choices[0].delta.tool_calls for tc in c.choices[0].delta.tool_calls]
    reason = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert "<tool_call>" not in content
    assert reason == (["tool_calls"] if calls else reason) and reason[0] in ("stop", "length", "tool_calls")


def test_a_dead_worker_is_replaced_and_serving_resumes(stack: RunningStack) -> None:
    import os
    import signal

    pid = json.loads((stack.home / "run" / "pids.json").read_text())["worker"]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 180
    while True:
        try:
            answer = client(stack).completions.create(model=DEMO_MODEL, prompt="The capital of France is",
                                                      max_tokens=4, temperature=0)
            break
        except openai.APIStatusError as exc:
            assert exc.status_code == 503 and time.monotonic() < deadline, exc
            time.sleep(1)
    assert answer.choices[0].text
    assert httpx.get(f"{stack.url}/readyz").status_code == 200
