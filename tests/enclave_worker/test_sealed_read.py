"""Reading a stored response back in sealed mode, in the worker (enclave_worker/sealed_read.py): the
one blob the gateway sends is opened and answered (the response, or a page of its input items) with
the head naming the id opened; another id's blob, a plaintext-mode state the gateway had sealed under
the id, a tampered blob, a revoked key and a malformed read are refused."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from enclave_worker.response_state import seal_state
from enclave_worker.sealed_read import read_stored
from protocol.openai.errors import OpenAIError
from protocol.rpc import worker_pb2
from protocol.sealed.http import STORED_READ
from tests.enclave_worker.test_response_state import DOC, _state
from tests.enclave_worker.test_sealed_state import _chain


def _read(history: list[worker_pb2.StateBlob], **fields: Any) -> worker_pb2.SealedRequest:
    body = {"model": "m", "part": "response", **fields}
    return worker_pb2.SealedRequest(tenant="acme", model="m", endpoint=STORED_READ, history=history,
                                    body=json.dumps(body).encode())


def _answer(state: Any, request: worker_pb2.SealedRequest) -> tuple[Any, dict[str, Any]]:
    head, body = read_stored(state, request, request.body)
    return head, json.loads(body)


def test_the_response_and_its_input_items_are_read_back() -> None:
    state = _state()
    [stored] = _chain(state, 1)
    head, response = _answer(state, _read([stored], response_id=stored.id))
    assert (head.status, head.history, response["id"]) == (200, (stored.id,), stored.id)
    assert response["output"][0]["content"][0]["text"] == "answer 0"
    head, items = _answer(state, _read([stored], response_id=stored.id, part="input_items", order="asc"))
    assert items["object"] == "list" and [i["content"][0]["text"] for i in items["data"]] == ["turn 0"]
    assert head.history == (stored.id,)


def _other_id(state: Any, stored: worker_pb2.StateBlob, other: worker_pb2.StateBlob) -> list[worker_pb2.StateBlob]:
    return [other]


def _relabelled(state: Any, stored: worker_pb2.StateBlob, other: worker_pb2.StateBlob) -> list[worker_pb2.StateBlob]:
    return [worker_pb2.StateBlob(id=stored.id, blob=other.blob)]


def _from_clear(state: Any, stored: worker_pb2.StateBlob, other: worker_pb2.StateBlob) -> list[worker_pb2.StateBlob]:
    forged = {**DOC, "response": {"id": stored.id}}  # what the gateway can have sealed under any id (SealState)
    return [worker_pb2.StateBlob(id=stored.id, blob=seal_state(state, "acme", stored.id, json.dumps(forged)))]


# What an operator holding the gateway's database could send instead of the state the client named.
OPERATOR_CASES = {
    "another response's state": (_other_id, 400, "state_mismatch"),
    "nothing": (lambda s, a, b: [], 400, "state_mismatch"),
    "two states": (lambda s, a, b: [b, a], 400, "state_mismatch"),
    "another response's blob under the id": (_relabelled, 404, "state_unreadable"),
    "a state sealed from clear text under the id": (_from_clear, 400, "state_mismatch"),
}


@pytest.mark.parametrize("case", OPERATOR_CASES)
def test_an_operator_cannot_answer_with_another_state(case: str) -> None:
    state = _state()
    [stored], [other] = _chain(state, 1), _chain(state, 1)
    tamper, status, code = OPERATOR_CASES[case]
    with pytest.raises(OpenAIError) as err:
        read_stored(state, _read(tamper(state, stored, other), response_id=stored.id),
                    _read([], response_id=stored.id).body)
    assert (err.value.status, err.value.code) == (status, code)


def test_a_revoked_key_makes_it_unreadable() -> None:
    state = _state()
    [stored] = _chain(state, 1)
    state.live.booted = SimpleNamespace(engine=object(), released=SimpleNamespace(data_key=b""))  # type: ignore[assignment]
    with pytest.raises(OpenAIError) as err:
        read_stored(state, _read([stored], response_id=stored.id), _read([stored], response_id=stored.id).body)
    assert (err.value.status, err.value.code) == (404, "state_unreadable")


@pytest.mark.parametrize(("fields", "param"), [
    ({"part": "everything"}, "part"),
    ({"limit": 0, "part": "input_items"}, "limit"),
    ({"order": "sideways", "part": "input_items"}, "order"),
    ({"colour": "red"}, "colour"),
    ({"include": ["message.input_image.image_url"]}, "include"),
    ({"stream": True}, "stream"),
    ({"model": "other"}, "model"),
])
def test_a_malformed_read_is_refused_by_name(fields: dict[str, Any], param: str) -> None:
    state = _state()
    [stored] = _chain(state, 1)
    request = _read([stored], response_id=stored.id, **fields)
    with pytest.raises(OpenAIError) as err:
        read_stored(state, request, request.body)
    assert (err.value.status, err.value.param) == (400, param)
