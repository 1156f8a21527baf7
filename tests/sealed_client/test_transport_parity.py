"""The sync and the async client go through one pin-and-retry implementation (sealed_client/flow.py):
a table of stale-pin and worker-change cases, each run through SealedOpenAI and AsyncSealedOpenAI
against the same hostile-gateway double (test_client_negative.World), must send the same requests in
the same order, pin as often, and end the same way."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx2
import openai
import pytest

from protocol.sealed import ReattestRequired
from sealed_client import AsyncSealedOpenAI, SealedOpenAI
from sealed_client.flow import RequestFlow
from tests.sealed_client.test_client_negative import World

SEALED = "/v1/sealed/chat/completions"
ATTEST = "/.well-known/attestation"
MESSAGES = [{"role": "user", "content": "hi"}]


class Gateway:
    """World's gateway, which can also refuse the caller's API key on the attestation document."""

    def __init__(self, world: World) -> None:
        self.world, self.refuse_key = world, False

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        if self.refuse_key and request.url.path == ATTEST:
            self.world.requests.append(ATTEST)
            return httpx2.Response(401, json={"error": {"message": "bad key", "type": "invalid_request_error",
                                                        "param": None, "code": "invalid_api_key"}})
        return self.world.handle(request)


def _worker_changed(world: World, gateway: Gateway) -> None:
    world.serving = world.documented = 1  # the old worker left; the new one is attested


def _new_worker_unattested(world: World, gateway: Gateway) -> None:
    world.serving = 1  # the gateway routes to a worker the document does not show


def _worker_left(world: World, gateway: Gateway) -> None:
    world.serving = 1

    def elsewhere(doc: dict[str, Any]) -> None:
        doc["model"] = "other"  # no worker of the deployment serves the model any more

    world.doc_edit = elsewhere


def _key_refused(world: World, gateway: Gateway) -> None:
    world.serving, gateway.refuse_key = 1, True


def _unchanged(world: World, gateway: Gateway) -> None:
    pass


@dataclass(frozen=True)
class Case:
    name: str
    change: Callable[[World, Gateway], None]  # what happens between the first (pinning) request and the second
    requests: list[str]  # what the gateway sees of the second request
    pins: int  # RequestFlow.pin calls for the second request
    outcome: type[Exception] | None  # None: the verified answer


CASES = [
    Case("pinned", _unchanged, [SEALED], 1, None),
    Case("worker changed, new one attested", _worker_changed, [SEALED, ATTEST, SEALED], 2, None),
    Case("stale pin, new worker unattested", _new_worker_unattested, [SEALED, ATTEST, SEALED], 2, ReattestRequired),
    Case("worker left", _worker_left, [SEALED, ATTEST], 2, openai.NotFoundError),
    Case("key refused on re-attestation", _key_refused, [SEALED, ATTEST], 2, openai.AuthenticationError),
]


def _run(case: Case, mode: str, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], int, str, str | None]:
    """(paths the gateway saw, pins, the answer or the error's type, the pinned key id) of the second request."""
    world = World()
    gateway = Gateway(world)
    pins = []
    original = RequestFlow.pin

    def counted(self: RequestFlow, model: str, auth: str | None = None) -> Any:
        pins.append(model)
        return original(self, model, auth)

    monkeypatch.setattr(RequestFlow, "pin", counted)
    kwargs = dict(base_url="http://gw/v1", api_key="sk-test", policy=world.policy(), max_retries=0,
                  inner_transport=httpx2.MockTransport(gateway))
    if mode == "sync":
        client = SealedOpenAI(**kwargs)

        def ask() -> str:
            return str(client.chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content)
    else:
        aclient = AsyncSealedOpenAI(**kwargs)
        client = aclient  # type: ignore[assignment]

        def ask() -> str:
            async def once() -> str:
                answer = await aclient.chat.completions.create(model="m", messages=MESSAGES)
                return str(answer.choices[0].message.content)
            return asyncio.run(once())

    assert ask() == "secret answer"
    assert world.requests == [ATTEST, SEALED] and len(pins) == 1  # first use: verified, then sent
    case.change(world, gateway)
    del world.requests[:], pins[:]
    try:
        outcome = ask()
    except Exception as exc:  # compared below, not swallowed
        outcome = type(exc).__name__
    pin = client.sealed.pinned("m")
    return list(world.requests), len(pins), outcome, pin.worker_key_id if pin else None


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_sync_and_async_clients_take_the_same_path(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    sync = _run(case, "sync", monkeypatch)
    asynchronous = _run(case, "async", monkeypatch)
    expected = "secret answer" if case.outcome is None else case.outcome.__name__
    for requests, pins, outcome, _ in (sync, asynchronous):
        assert (requests, pins, outcome) == (case.requests, case.pins, expected)
    assert (sync[3] is None) == (asynchronous[3] is None)  # both keep a pin, or both dropped it


def test_a_retry_is_sealed_to_the_newly_verified_key() -> None:
    """Negative control for the table: with a worker change, the second send carries the new key id."""
    world = World()
    client = SealedOpenAI(base_url="http://gw/v1", api_key="sk-test", policy=world.policy(), max_retries=0,
                          inner_transport=httpx2.MockTransport(world.handle))
    client.chat.completions.create(model="m", messages=MESSAGES)
    first = client.sealed.pinned("m")
    assert first is not None and first.worker_key_id == world.workers[0].key.key_id
    world.serving = world.documented = 1
    client.chat.completions.create(model="m", messages=MESSAGES)
    second = client.sealed.pinned("m")
    assert second is not None and second.worker_key_id == world.workers[1].key.key_id
