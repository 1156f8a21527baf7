"""The walking skeleton, end to end, through the official openai client."""

from __future__ import annotations

import json
from typing import Any as RunningStack  # the `stack` fixture's type lives in conftest.py

import httpx
import openai
import pytest

from api.stack import DEMO_MODEL

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def client(stack: RunningStack, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=key or stack.api_key, max_retries=0)


def test_streamed_greedy_chat_answers_paris_with_usage_in_final_chunk(stack: RunningStack) -> None:
    chunks = list(client(stack).chat.completions.create(
        model=DEMO_MODEL, messages=QUESTION, temperature=0, max_tokens=32, stream=True,
        stream_options={"include_usage": True},
    ))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
    final = chunks[-1]
    assert final.choices == []
    assert final.usage is not None and final.usage.completion_tokens > 0 and final.usage.prompt_tokens > 0
    assert final.usage.total_tokens == final.usage.prompt_tokens + final.usage.completion_tokens
    # Every chunk from the simulated TEE says so.
    assert all(getattr(c, "insecure", None) is True and getattr(c, "tee", None) == "sim" for c in chunks)


def test_non_streamed_chat_and_completion(stack: RunningStack) -> None:
    answer = client(stack).chat.completions.create(model=DEMO_MODEL, messages=QUESTION, temperature=0,
                                                   max_tokens=32)
    assert "Paris" in answer.choices[0].message.content
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.usage.completion_tokens >= 1
    assert getattr(answer, "insecure", None) is True
    done = client(stack).completions.create(model=DEMO_MODEL, prompt="The capital of France is", max_tokens=8,
                                            temperature=0)
    assert done.choices[0].text
    assert done.usage.completion_tokens <= 8


def test_models_lists_the_tenants_model(stack: RunningStack) -> None:
    assert [m.id for m in client(stack).models.list()] == [DEMO_MODEL]


def test_unknown_model_is_404(stack: RunningStack) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        client(stack).chat.completions.create(model="no-such-model", messages=QUESTION)
    assert err.value.body["code"] == "model_not_found"


@pytest.mark.parametrize("key", ["sk-sealed-wrong", "x"])
def test_wrong_api_key_is_401(stack: RunningStack, key: str) -> None:
    with pytest.raises(openai.AuthenticationError):
        client(stack, key).chat.completions.create(model=DEMO_MODEL, messages=QUESTION)


def test_missing_api_key_is_401_in_openai_shape(stack: RunningStack) -> None:
    r = httpx.post(f"{stack.url}/v1/chat/completions", json={"model": DEMO_MODEL, "messages": QUESTION})
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"


BAD_BODIES = [
    ("not json at all", 400),
    (json.dumps({"model": DEMO_MODEL}), 400),  # messages missing
    (json.dumps({"model": DEMO_MODEL, "messages": []}), 400),
    (json.dumps({"model": DEMO_MODEL, "messages": QUESTION, "temperature": 9}), 400),
    (json.dumps({"model": DEMO_MODEL, "messages": QUESTION, "max_tokens": 0}), 400),
    (json.dumps({"model": DEMO_MODEL, "messages": [{"role": "wizard", "content": "hi"}]}), 400),
    (json.dumps({"model": DEMO_MODEL, "messages": QUESTION, "bogus_field": 1}), 400),
    (json.dumps({"model": DEMO_MODEL, "messages": QUESTION, "top_p": 0}), 400),
]


@pytest.mark.parametrize(("body", "status"), BAD_BODIES)
def test_malformed_requests_get_openai_errors(stack: RunningStack, body: str, status: int) -> None:
    r = httpx.post(f"{stack.url}/v1/chat/completions", content=body,
                   headers={"Authorization": f"Bearer {stack.api_key}", "Content-Type": "application/json"})
    assert r.status_code == status
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]


def test_well_known_attestation_serves_evidence_and_a_verifiable_token(stack: RunningStack) -> None:
    import datetime as dt

    from attestation.bundle import EvidenceBundle, check_binding
    from attestation.sim import parse_sim_report
    from attestation.token import TokenVerifier

    doc = httpx.get(f"{stack.url}/.well-known/attestation",
                    headers={"Authorization": f"Bearer {stack.api_key}"}).json()
    (worker,) = doc["workers"]
    assert worker["tee"] == "sim" and worker["insecure"] is True
    bundle = EvidenceBundle.from_json(worker["evidence"])
    check_binding(parse_sim_report(bundle.cpu_evidence).report_data, bundle)
    jwks = json.loads((stack.home / "broker" / "jwks.json").read_text())  # the broker's published JWKS
    claims = TokenVerifier(jwks, "sealed-key-broker").verify(worker["token"], dt.datetime.now(dt.UTC))
    assert claims["insecure"] is True and claims["tee"] == "sim"
    assert claims["runtime_data"]["hpke_public_key"] == bundle.runtime_data.hpke_public_key.hex()
    assert claims["sealed"]["model"] == DEMO_MODEL

