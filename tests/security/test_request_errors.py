"""#13 finding 2: one request must not take a model down for every tenant.

A lone surrogate (JSON-escaped "\\ud800") and a chunked body over the size limit are rejected at the
edge with 400/413; input that still reaches a worker comes back as INVALID_ARGUMENT; and no single
request's error marks a worker dead (only missed heartbeats do). Run through a real `sealed up`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import grpc
import httpx
import pytest

from api.stack import DEMO_MODEL
from protocol.rpc import worker_pb2, worker_pb2_grpc
from protocol.tls import TARGET_NAME
from tests.api.conftest import RunningStack

MODEL = f'"model": "{DEMO_MODEL}", "max_tokens": 2'
SURROGATE_CHAT = '{' + MODEL + ', "messages": [{"role": "user", "content": "hi \\ud800"}]}'


def _headers(stack: RunningStack) -> dict[str, str]:
    return {"Authorization": f"Bearer {stack.api_key}", "Content-Type": "application/json"}


def _answers(stack: RunningStack) -> None:
    r = httpx.post(f"{stack.url}/v1/completions", headers=_headers(stack), timeout=60,
                   json={"model": DEMO_MODEL, "prompt": "The capital of France is", "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert httpx.get(f"{stack.url}/readyz", timeout=10).status_code == 200


@pytest.mark.parametrize("route,body", [
    ("/v1/chat/completions", SURROGATE_CHAT),
    ("/v1/completions", '{' + MODEL + ', "prompt": "\\udfff x"}'),
    ("/v1/completions", '{' + MODEL + ', "prompt": ["ok", "\\ud800"]}'),
])
def test_lone_surrogate_is_400_at_the_edge_and_the_model_stays_up(stack: RunningStack, route: str,
                                                                  body: str) -> None:
    for _ in range(3):
        r = httpx.post(f"{stack.url}{route}", content=body, headers=_headers(stack), timeout=60)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["type"] == "invalid_request_error"
    _answers(stack)


def test_chunked_body_over_the_limit_is_413_and_the_model_stays_up(stack: RunningStack) -> None:
    head = ('{' + MODEL + ', "messages": [{"role": "user", "content": "').encode()

    def body() -> Iterator[bytes]:  # no Content-Length: Transfer-Encoding: chunked
        yield head
        for _ in range(6):
            yield b"a" * (1 << 20)
        yield b'"}]}'

    r = httpx.post(f"{stack.url}/v1/chat/completions", content=body(), headers=_headers(stack), timeout=60)
    assert r.status_code == 413, r.text
    _answers(stack)


def _worker_stub(stack: RunningStack) -> tuple[grpc.Channel, worker_pb2_grpc.WorkerStub]:
    from api.management.auth import issue_token

    token = issue_token((stack.home / "gateway" / "jwt-secret").read_text().strip(), "test", "operator")
    (worker,) = httpx.get(f"{stack.url}/admin/v1/workers", headers={"Authorization": f"Bearer {token}"}
                          ).json()["data"]
    gw = stack.home / "gateway"
    creds = grpc.ssl_channel_credentials(root_certificates=worker["tls_cert"].encode(),
                                         private_key=(gw / "gateway-client.key").read_bytes(),
                                         certificate_chain=(gw / "gateway-client.pem").read_bytes())
    channel = grpc.secure_channel(worker["grpc_address"], creds,
                                  options=[("grpc.ssl_target_name_override", TARGET_NAME),
                                           ("grpc.max_send_message_length", 64 << 20)])
    return channel, worker_pb2_grpc.WorkerStub(channel)


@pytest.mark.parametrize("messages,tools", [
    ([{"role": "user", "content": "hi \ud800"}], None),
    ({"role": "user"}, None),
    ([["not", "an", "object"]], None),
])
def test_invalid_text_reaching_the_worker_is_invalid_argument(stack: RunningStack, messages: list,
                                                              tools: list | None) -> None:
    channel, stub = _worker_stub(stack)
    with channel:
        request = worker_pb2.GenerateRequest(request_id="sec-1", tenant="demo", key_id="k", kind="chat",
                                             messages_json=json.dumps(messages),
                                             tools_json=json.dumps(tools) if tools else "",
                                             params=worker_pb2.SamplingParams(max_tokens=2))
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Generate(request, timeout=60))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    _answers(stack)


def test_sealed_up_says_ready_only_when_a_request_can_be_answered(stack: RunningStack) -> None:
    """#14: the first client, right after the ready line, sees the model listed and gets an answer."""
    first = json.loads((stack.tmpdir / "first-contact.json").read_text())
    assert [m["id"] for m in first["models"]["data"]] == [DEMO_MODEL]
    assert first["chat"] == 200
