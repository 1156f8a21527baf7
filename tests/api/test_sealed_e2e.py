"""Sealed mode end to end on `sealed up`: the official openai SDK through SealedOpenAI answers exactly
as it does in plaintext (greedy, seeded: the same tokens and text; logprobs equal up to float
rounding, see ``_same``), every answer carries a verified receipt, and errors keep their OpenAI shape."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import os
from typing import Any
from typing import Any as RunningStack

import openai
import pytest

from api.stack import DEMO_MODEL
from sealed_client import AsyncSealedOpenAI, SealedOpenAI
from tests.api.sealed_helpers import demo_client_policy

Q = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def plain(stack: RunningStack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.api_key, max_retries=0)


def sealed(stack: RunningStack) -> SealedOpenAI:
    return SealedOpenAI(base_url=f"{stack.url}/v1", api_key=stack.api_key, max_retries=0,
                        policy=demo_client_policy(stack.home))


def _norm(doc: Any) -> Any:
    """Drop what differs between two runs of the same greedy request: ids and times."""
    doc = copy.deepcopy(doc)
    if isinstance(doc, dict):
        for k in ("id", "created"):
            doc.pop(k, None)
        return {k: _norm(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_norm(v) for v in doc]
    return doc


PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                          "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("chat", {"messages": Q, "temperature": 0, "max_tokens": 16}),
    "chat streamed with usage": ("chat", {"messages": Q, "temperature": 0, "max_tokens": 16, "stream": True,
                                          "stream_options": {"include_usage": True}}),
    "n=2 with seed and stop": ("chat", {"messages": Q, "n": 2, "seed": 7, "temperature": 0.8, "max_tokens": 12,
                                        "stop": ["."]}),
    "chat logprobs": ("chat", {"messages": Q, "temperature": 0, "max_tokens": 4, "logprobs": True,
                               "top_logprobs": 2}),
    "chat logprobs streamed": ("chat", {"messages": Q, "temperature": 0, "max_tokens": 4, "logprobs": True,
                                        "top_logprobs": 2, "stream": True}),
    "forced tool call": ("chat", {"messages": [{"role": "user", "content": "Weather in Paris?"}],
                                  "tools": WEATHER, "max_tokens": 40, "temperature": 0,
                                  "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
    "json mode": ("chat", {"messages": [{"role": "user", "content": "Give a JSON object with a name."}],
                           "response_format": {"type": "json_object"}, "temperature": 0, "max_tokens": 24}),
    # Constrained decoding and sampling settings travel inside the sealed request (the OpenAI layer
    # runs in the worker): sampled answers equal the plaintext ones seed for seed.
    "json schema sampled": ("chat", {"messages": [{"role": "user", "content": "Invent a person."}],
                                     "response_format": {"type": "json_schema", "json_schema": {
                                         "name": "p", "schema": PERSON}}, "temperature": 1.0, "seed": 5,
                                     "max_tokens": 48}),
    "json schema streamed": ("chat", {"messages": [{"role": "user", "content": "Invent a person."}],
                                      "response_format": {"type": "json_schema", "json_schema": {
                                          "name": "p", "schema": PERSON}}, "temperature": 1.0, "seed": 6,
                                      "max_tokens": 48, "stream": True}),
    "penalties, bias and min_p": ("chat", {"messages": [{"role": "user", "content": "Count to five."}],
                                           "temperature": 0.8, "seed": 7, "max_tokens": 16, "frequency_penalty": 1.0,
                                           "presence_penalty": 0.5, "logit_bias": {"28": -100},
                                           "extra_body": {"min_p": 0.05, "repetition_penalty": 1.2}}),
    "completion with logprobs and echo": ("completion", {"prompt": "The capital of France is", "max_tokens": 4,
                                                         "temperature": 0, "logprobs": 2, "echo": True}),
    "completion streamed with usage": ("completion", {"prompt": "The capital of France is", "max_tokens": 4,
                                                      "temperature": 0, "stream": True,
                                                      "stream_options": {"include_usage": True}}),
}


def _same(got: Any, want: Any, path: str = "") -> None:
    """Equal, except that floats (logprobs) may differ by float rounding: the second of two identical
    requests is served partly from the prefix cache, so its prompt's tail runs as a smaller GEMM, and
    OpenBLAS's fp32 results depend on the row count and its thread count (up to ~1e-6 on a layer's
    output, measured 2026-12-02). Tokens, text, usage and everything else must match exactly."""
    if isinstance(want, float) and isinstance(got, float):
        assert abs(got - want) <= 1e-3 + 1e-3 * abs(want), (path, got, want)
    elif isinstance(want, dict) and isinstance(got, dict):
        assert got.keys() == want.keys(), (path, sorted(got), sorted(want))
        for key in want:
            _same(got[key], want[key], f"{path}.{key}")
    elif isinstance(want, list) and isinstance(got, list):
        assert len(got) == len(want), (path, len(got), len(want))
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _same(g, w, f"{path}[{i}]")
    else:
        assert got == want, (path, got, want)


def _call(client: openai.OpenAI, kind: str, args: dict[str, Any]) -> Any:
    api = client.chat.completions if kind == "chat" else client.completions
    out = api.create(model=DEMO_MODEL, **args)
    if args.get("stream"):
        return [_norm(c.model_dump()) for c in out]
    doc = _norm(out.model_dump())
    for choice in doc.get("choices", []):
        for call in (choice.get("message") or {}).get("tool_calls") or []:
            call.pop("id", None)
    return doc


@pytest.mark.parametrize("case", list(CASES))
def test_sealed_answers_exactly_as_plaintext(stack: RunningStack, case: str) -> None:
    kind, args = CASES[case]
    s = sealed(stack)
    got = _call(s, kind, args)
    _same(got, _call(plain(stack), kind, args))
    assert len(s.sealed.receipts) == 1
    receipt = s.sealed.receipts[0]
    assert (receipt.tee, receipt.insecure, receipt.model) == ("sim", True, DEMO_MODEL)
    assert receipt.completion_tokens > 0 and receipt.prompt_tokens > 0 and receipt.policy_version >= 1


def test_receipt_counts_match_the_usage_the_client_sees(stack: RunningStack) -> None:
    s = sealed(stack)
    answer = s.chat.completions.create(model=DEMO_MODEL, messages=Q, temperature=0, max_tokens=8)
    receipt = s.sealed.receipts[-1]
    assert (receipt.prompt_tokens, receipt.completion_tokens) == (answer.usage.prompt_tokens,
                                                                  answer.usage.completion_tokens)
    raw = s.chat.completions.with_raw_response.create(model=DEMO_MODEL, messages=Q, temperature=0, max_tokens=2)
    assert raw.headers["sealed-receipt"]  # the non-streamed answer carries its receipt as a header too


def test_errors_keep_their_openai_shape_in_sealed_mode(stack: RunningStack) -> None:
    s = sealed(stack)
    with pytest.raises(openai.BadRequestError) as bad:  # the worker answers it, sealed
        s.chat.completions.create(model=DEMO_MODEL, messages=Q, temperature=5)
    assert bad.value.body["code"] == "invalid_value"
    with pytest.raises(openai.BadRequestError):
        s.chat.completions.create(model=DEMO_MODEL, messages=Q, tools=WEATHER,
                                  tool_choice={"type": "function", "function": {"name": "nope"}})
    with pytest.raises(openai.NotFoundError) as missing:  # no attested worker serves it: nothing is sent
        s.chat.completions.create(model="no-such-model", messages=Q)
    assert missing.value.body["code"] == "model_not_found"
    with pytest.raises(openai.AuthenticationError):  # the gateway answers it, in the clear
        SealedOpenAI(base_url=f"{stack.url}/v1", api_key="sk-wrong", max_retries=0,
                     policy=demo_client_policy(stack.home)).chat.completions.create(model=DEMO_MODEL, messages=Q)


def test_models_and_usage_pass_through(stack: RunningStack) -> None:
    assert [m.id for m in sealed(stack).models.list()] == [DEMO_MODEL]


def test_async_client_streams_sealed(stack: RunningStack) -> None:
    async def run() -> tuple[str, int]:
        client = AsyncSealedOpenAI(base_url=f"{stack.url}/v1", api_key=stack.api_key, max_retries=0,
                                   policy=demo_client_policy(stack.home))
        stream = await client.chat.completions.create(model=DEMO_MODEL, messages=Q, temperature=0, max_tokens=16,
                                                      stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        await client.close()
        return text, len(client.sealed.receipts)

    text, receipts = asyncio.run(run())
    assert "Paris" in text and receipts == 1


def test_require_sealed_refuses_plaintext_for_that_tenant_only_in_the_clear(stack: RunningStack) -> None:
    import httpx

    from api.home import Home
    from api.management.auth import issue_token
    from api.stack import DEMO_TENANT, demo_policy_set
    from policy.documents import sign_policy_document
    from tests.api.sealed_helpers import ed25519

    home = Home(stack.home)
    token = issue_token((stack.home / "gateway" / "jwt-secret").read_text().strip(), "ops", "operator")
    admin = ed25519(home.tenant_policy_admin(DEMO_TENANT))

    def put(require: bool) -> None:
        doc = {**demo_policy_set(stack.api_key), "version": 2, "require_sealed": require}
        r = httpx.put(f"{stack.url}/admin/v1/tenants/{DEMO_TENANT}/policy", headers={
            "Authorization": f"Bearer {token}"}, json={"document": sign_policy_document(doc, admin, "demo-admin")})
        assert r.status_code == 200, r.text

    put(True)
    try:
        import time

        time.sleep(1.2)  # the gateway caches policy rows for up to a second
        with pytest.raises(openai.PermissionDeniedError) as refused:
            plain(stack).chat.completions.create(model=DEMO_MODEL, messages=Q, max_tokens=2)
        assert refused.value.body["code"] == "sealed_required"
        assert sealed(stack).chat.completions.create(model=DEMO_MODEL, messages=Q, max_tokens=2).choices
    finally:
        put(False)
        time.sleep(1.2)
    assert plain(stack).chat.completions.create(model=DEMO_MODEL, messages=Q, max_tokens=2).choices


@pytest.fixture(scope="module")
def proxy_url(stack: RunningStack):  # type: ignore[no-untyped-def]
    """`sealed proxy` in this process (uvicorn in a thread), in front of the stack."""
    import threading
    import time

    import uvicorn

    from api.stack import free_port
    from sealed_client.deployment import ClientTrust
    from sealed_client.proxy import create_proxy_app

    app = create_proxy_app(f"{stack.url}/v1", ClientTrust.from_dict(demo_client_policy(stack.home)))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1", app
    server.should_exit = True
    thread.join(10)


@pytest.mark.parametrize("case", ["chat", "chat streamed with usage", "n=2 with seed and stop", "chat logprobs",
                                  "forced tool call", "completion with logprobs and echo"])
def test_the_proxy_answers_exactly_as_plaintext(stack: RunningStack, proxy_url: Any, case: str) -> None:
    url, app = proxy_url
    kind, args = CASES[case]
    before = len(app.state.session.receipts)
    through_proxy = openai.OpenAI(base_url=url, api_key=stack.api_key, max_retries=0)
    _same(_call(through_proxy, kind, args), _call(plain(stack), kind, args))
    assert len(app.state.session.receipts) == before + 1


def test_the_proxy_seals_the_responses_api(stack: RunningStack, proxy_url: Any) -> None:
    url, app = proxy_url
    before = len(app.state.session.receipts)
    through_proxy = openai.OpenAI(base_url=url, api_key=stack.api_key, max_retries=0)
    args: dict[str, Any] = {"model": DEMO_MODEL, "input": "What is the capital of France?", "temperature": 0,
                            "max_output_tokens": 8}
    want = plain(stack).responses.create(**args)
    assert through_proxy.responses.create(**args).output_text == want.output_text
    with through_proxy.responses.stream(**args) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
    assert "".join(deltas) == want.output_text
    assert len(app.state.session.receipts) == before + 2


def test_the_proxy_shows_the_receipt_and_keeps_errors(stack: RunningStack, proxy_url: Any) -> None:
    url, _ = proxy_url
    through_proxy = openai.OpenAI(base_url=url, api_key=stack.api_key, max_retries=0)
    raw = through_proxy.chat.completions.with_raw_response.create(model=DEMO_MODEL, messages=Q, max_tokens=2)
    signed = json.loads(base64.b64decode(raw.headers["sealed-receipt"]))  # the signed receipt: a third party checks it
    assert signed["receipt"]["model"] == DEMO_MODEL and signed["signature"]
    with pytest.raises(openai.BadRequestError):
        through_proxy.chat.completions.create(model=DEMO_MODEL, messages=Q, temperature=5)
    with pytest.raises(openai.NotFoundError):
        through_proxy.chat.completions.create(model="no-such-model", messages=Q)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url, api_key="sk-wrong", max_retries=0).chat.completions.create(
            model=DEMO_MODEL, messages=Q)


def test_sealed_verify_prints_what_it_verified_and_fails_closed(stack: RunningStack, tmp_path: Any) -> None:
    import subprocess
    import sys

    policy = tmp_path / "client-policy.json"
    policy.write_text(json.dumps(demo_client_policy(stack.home)))

    def verify(*args: str, api_key: str | None = stack.api_key) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k not in ("SEALED_API_KEY", "OPENAI_API_KEY")}
        if api_key:
            env["SEALED_API_KEY"] = api_key  # never on the command line
        return subprocess.run([sys.executable, "-m", "api.cli.main", "verify", stack.url, *args],
                              capture_output=True, text=True, timeout=120, env=env)

    anonymous = verify("--policy", str(policy), api_key=None)  # the gateway lists no workers to strangers
    assert anonymous.returncode == 1 and "answered 401" in anonymous.stderr

    ok = verify("--policy", str(policy))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    for what in ("TEE           sim", "measurement", "sealing key", "receipt key", "prompts_logged=False",
                 "tenant policy version 1", "1 of 1 workers verified"):
        assert what in ok.stdout
    assert "verified from the hardware evidence" in ok.stdout and "REPORT_DATA" in ok.stdout
    # A policy that allows no measurement: non-zero, with the reason.
    doc = demo_client_policy(stack.home)
    doc.pop("reference_values", None)
    doc["appraisal"]["allowed_measurements"] = []
    policy.write_text(json.dumps(doc))
    refused = verify("--policy", str(policy))
    assert refused.returncode == 1 and "measurement is not in the allowed set" in refused.stdout
    # No policy: no tenant, so nothing can be verified for anyone.
    nothing = verify("--unsafe-allow-simulated", "--unsafe-trust-gateway-jwks")
    assert nothing.returncode == 2 and "tenant" in nothing.stderr
