"""Every API surface goes through the gateway's one request lifecycle (api/gateway/lifecycle.py):
a plaintext chat completion, a sealed chat completion, a completion and a response, each sent over
HTTP to the real app in front of a real worker servicer (gRPC, stand-in engine), make the same
admission, span, relay, metering, audit and settlement calls, each exactly once."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.app import create_app
from api.gateway import lifecycle
from api.gateway.admission import AdmissionController
from api.gateway.lifecycle import RequestLifecycle
from api.gateway.metering import Metering
from api.gateway.service import GatewayService
from api.gateway.tickets import Admission
from protocol.sealed import RequestContext, seal_request
from protocol.sealed.http import HEADER_KEY_ID, HEADER_MODEL, REQUEST_CONTENT_TYPE
from tests.security.sealed_harness import ENDPOINT, Stack, sealed_stack

# The lifecycle's steps, as the calls that make them: admit (ticket, slot), span, route and relay,
# meter, audit (what the worker's trailers carry), settle.
STEPS = ("ticket", "request_span", "admit", "slot", "relay", "meter", "audit_trailers", "settle", "refund")


class Recorder:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        self.sealed: list[bool] = []
        self._wrap(monkeypatch, Admission, "ticket", "ticket")
        self._wrap(monkeypatch, lifecycle, "request_span", "request_span")
        self._wrap(monkeypatch, RequestLifecycle, "admit", "admit")
        self._wrap(monkeypatch, AdmissionController, "slot", "slot")
        self._wrap(monkeypatch, GatewayService, "_relay", "relay")
        self._wrap(monkeypatch, Metering, "record", "meter")
        self._wrap(monkeypatch, GatewayService, "_audit_trailers", "audit_trailers")
        self._wrap(monkeypatch, AdmissionController, "settle", "refund")
        settle = RequestLifecycle.settle

        async def settle_once(life: RequestLifecycle, error: str = "") -> None:
            if not life._settled:  # settle is idempotent: the first call is the one that settles
                self.calls.append("settle")
            await settle(life, error)

        monkeypatch.setattr(RequestLifecycle, "settle", settle_once)

    def _wrap(self, monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, step: str) -> None:
        original: Callable[..., Any] = getattr(owner, name)

        def recorded(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(step)
            if step == "request_span":
                self.sealed.append(kwargs["sealed"])
            return original(*args, **kwargs)  # an awaitable or a generator is returned as it is

        monkeypatch.setattr(owner, name, recorded)

    def take(self) -> list[str]:
        calls, self.calls = self.calls, []
        return calls


def _sealed_body(stack: Stack, key_id: str) -> tuple[bytes, str]:
    serving = stack.state.serving_key
    guard = stack.state.guard
    ctx = RequestContext("acme", "m", ENDPOINT, serving.key_id, version="v1", api_key_id=key_id,
                         policy_version=guard.policy_set.version if guard and guard.policy_set else 0)
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]}
    return seal_request(serving.public_bytes, ctx, json.dumps(body).encode(), time.time()).wire, serving.key_id


@asynccontextmanager
async def _client(stack: Stack) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    secret, key = stack.store.create_key("acme", "http")
    app = create_app(stack.service.settings, stack.service)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw", timeout=30,
                                 headers={"Authorization": f"Bearer {secret}"}) as client:
        yield client, key.key_id


async def test_plaintext_sealed_completion_and_response_share_one_lifecycle(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with sealed_stack(tmp_path, None) as stack:
        recorder = Recorder(monkeypatch)
        async with _client(stack) as (client, key_id):
            messages = [{"role": "user", "content": "hello"}]
            answers = {
                "chat": await client.post("/v1/chat/completions", json={"model": "m", "messages": messages,
                                                                        "max_tokens": 4}),
            }
            seen = {"chat": recorder.take()}
            wire, worker_key = _sealed_body(stack, key_id)
            answers["sealed chat"] = await client.post(
                "/v1/sealed/chat/completions", content=wire,
                headers={"content-type": REQUEST_CONTENT_TYPE, HEADER_MODEL: "m", HEADER_KEY_ID: worker_key})
            seen["sealed chat"] = recorder.take()
            answers["completion"] = await client.post("/v1/completions", json={"model": "m", "prompt": "hello",
                                                                               "max_tokens": 4})
            seen["completion"] = recorder.take()
            answers["response"] = await client.post("/v1/responses", json={"model": "m", "input": "hello",
                                                                           "max_output_tokens": 16})
            seen["response"] = recorder.take()
    for surface, answer in answers.items():
        assert answer.status_code == 200, (surface, answer.text)
    assert answers["response"].json()["object"] == "response"
    assert answers["sealed chat"].content and b"hello" not in answers["sealed chat"].content  # ciphertext
    for surface, calls in seen.items():
        assert Counter(calls) == Counter(STEPS), surface  # every step, each once
        assert calls.index("ticket") < calls.index("admit") < calls.index("relay") < calls.index("settle"), surface
    assert recorder.sealed == [False, True, False, False]  # one span each, the sealed one marked so


async def test_a_request_refused_at_admission_is_audited_and_never_routed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same lifecycle refuses: a key over its budget is refused (and audited) at the ticket,
    before any slot, span, worker or settlement; and a sealed request the gateway cannot route
    (no pinned worker key) never enters the lifecycle."""
    async with sealed_stack(tmp_path, None) as stack:
        recorder = Recorder(monkeypatch)
        async with _client(stack) as (client, _):
            stack.store.ensure_tenant("acme", token_budget=1)
            stack.service.catalog.forget()
            refused = await client.post("/v1/completions", json={"model": "m", "prompt": "hello", "max_tokens": 4})
            assert refused.status_code == 400 and refused.json()["error"]["code"] == "request_too_large"
            assert recorder.take() == ["ticket"]
            unpinned = await client.post("/v1/sealed/chat/completions", content=b"x",
                                         headers={"content-type": REQUEST_CONTENT_TYPE, HEADER_MODEL: "m"})
            assert unpinned.status_code == 400
            assert recorder.take() == []
        stack.service.audit.flush()
        entries = [json.loads(line) for line in stack.service.audit.path.read_text().splitlines()]
        assert any(e.get("action") == "admission" and e.get("decision") == "deny" for e in entries)
