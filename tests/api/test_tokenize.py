"""/tokenize and /detokenize as in vLLM (#14): authenticated, tokenized by the worker with the same
rendering the engine sees, vLLM's request and response shapes."""

from __future__ import annotations

from typing import Any as RunningStack  # the `stack` fixture's type lives in conftest.py

import httpx

from api.stack import DEMO_MODEL


def _post(stack: RunningStack, path: str, body: dict, key: str | None = None) -> httpx.Response:
    return httpx.post(f"{stack.url}{path}", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {key or stack.api_key}"})


def test_tokenize_and_detokenize_round_trip(stack: RunningStack) -> None:
    text = "The capital of France is Paris."
    r = _post(stack, "/tokenize", {"model": DEMO_MODEL, "prompt": text, "return_token_strs": True})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert set(doc) == {"count", "max_model_len", "tokens", "token_strs"}
    assert doc["count"] == len(doc["tokens"]) == len(doc["token_strs"]) > 3
    assert doc["max_model_len"] >= 2048 and all(isinstance(t, int) for t in doc["tokens"])
    back = _post(stack, "/detokenize", {"model": DEMO_MODEL, "tokens": doc["tokens"]})
    assert back.status_code == 200 and back.json() == {"prompt": text}


def test_chat_tokenize_counts_what_the_engine_sees(stack: RunningStack) -> None:
    messages = [{"role": "user", "content": "What is 2+2? <|im_start|>system"}]
    doc = _post(stack, "/tokenize", {"model": DEMO_MODEL, "messages": messages}).json()
    assert doc["token_strs"] is None
    answer = _post(stack, "/v1/chat/completions", {"model": DEMO_MODEL, "messages": messages, "max_tokens": 1})
    assert answer.json()["usage"]["prompt_tokens"] == doc["count"]
    # Without the generation prompt: "<|im_start|>assistant\n" fewer tokens.
    bare = _post(stack, "/tokenize", {"model": DEMO_MODEL, "messages": messages, "add_generation_prompt": False})
    assert 0 < doc["count"] - bare.json()["count"] <= 4


def test_tokenize_refuses_bad_requests(stack: RunningStack) -> None:
    r = httpx.post(f"{stack.url}/tokenize", json={"model": DEMO_MODEL, "prompt": "x"}, timeout=30)
    assert r.status_code == 401
    assert _post(stack, "/tokenize", {"model": "nope", "prompt": "x"}).status_code == 404
    assert _post(stack, "/tokenize", {"model": DEMO_MODEL}).status_code == 400
    assert _post(stack, "/tokenize", {"model": DEMO_MODEL, "prompt": "x",
                                      "messages": [{"role": "user", "content": "x"}]}).status_code == 400
    assert _post(stack, "/detokenize", {"model": DEMO_MODEL, "tokens": [10**9]}).status_code == 400
    assert _post(stack, "/detokenize", {"model": DEMO_MODEL, "tokens": [-1]}).status_code == 400
