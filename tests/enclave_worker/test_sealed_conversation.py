"""Conversations in sealed mode, in the worker (enclave_worker/sealed_conversation.py): each call opens
only the one sealed-mode conversation it names, answers as the plaintext routes do, and a change
seals the whole conversation again one version higher; what an operator could send instead (another
conversation, a state it had sealed from clear text, a tampered blob, nothing) is refused, a revoked
key makes it unreadable, and a turn continues the conversation's items and adds its own."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from enclave_worker.response_state import SealedOnlyState, open_state, seal_state
from enclave_worker.sealed_conversation import conversation_call
from enclave_worker.sealed_state import begin_sealed_turn
from enclave_worker.state import WorkerState
from protocol.openai.errors import OpenAIError
from protocol.openai.responses_request import ResponsesRequest
from protocol.rpc import worker_pb2
from protocol.sealed.http import CONVERSATIONS, ResponseHead
from tests.enclave_worker.test_response_state import DOC, _state

USER = {"type": "message", "role": "user", "content": "My name is Ada."}


def _call(state: WorkerState, op: str, history: list[worker_pb2.StateBlob], conv_id: str | None = None,
          **fields: Any) -> tuple[ResponseHead, Any, worker_pb2.StateBlob | None]:
    body = json.dumps({"model": "m", "op": op, "conversation_id": conv_id, **fields}).encode()
    request = worker_pb2.SealedRequest(tenant="acme", model="m", endpoint=CONVERSATIONS, history=history, body=body)
    head, answer, stored = conversation_call(state, request, body)
    return head, json.loads(answer), stored


def _created(state: WorkerState, **body: Any) -> worker_pb2.StateBlob:
    _, _, stored = _call(state, "create", [], body={"items": [USER], "metadata": {"topic": "names"}, **body})
    assert stored is not None
    return stored


def test_create_read_and_change_a_conversation_one_version_at_a_time() -> None:
    state = _state()
    head, created, v1 = _call(state, "create", [], body={"items": [USER], "metadata": {"topic": "names"}})
    assert v1 is not None and created["id"] == v1.id and created["metadata"] == {"topic": "names"}
    assert head.conversation is not None and (head.conversation.opened_version, head.conversation.version) == (0, 1)
    assert b"Ada" not in v1.blob and b"names" not in v1.blob  # ciphertext only
    head, items, unchanged = _call(state, "list_items", [v1], v1.id, query={"order": "asc"})
    assert unchanged is None and [i["content"][0]["text"] for i in items["data"]] == ["My name is Ada."]
    assert head.conversation is not None and head.conversation.opened_version == head.conversation.version == 1
    digest_v1 = head.conversation.digest
    head, added, v2 = _call(state, "create_items", [v1], v1.id,
                            body={"items": [{"type": "message", "role": "assistant", "content": "Noted."}]})
    assert v2 is not None and head.conversation is not None
    assert (head.conversation.opened_digest, head.conversation.version) == (digest_v1, 2)
    item_id = added["data"][0]["id"]
    assert _call(state, "retrieve_item", [v2], v2.id, item_id=item_id)[1]["id"] == item_id
    _, updated, v3 = _call(state, "update", [v2], v2.id, body={"metadata": {"topic": "ids"}})
    assert updated["metadata"] == {"topic": "ids"} and v3 is not None
    _, _, v4 = _call(state, "delete_item", [v3], v3.id, item_id=item_id)
    assert v4 is not None
    with pytest.raises(OpenAIError) as gone:
        _call(state, "retrieve_item", [v4], v4.id, item_id=item_id)
    assert gone.value.status == 404
    assert len(_call(state, "list_items", [v4], v4.id)[1]["data"]) == 1


def test_a_turn_continues_the_items_and_adds_its_own() -> None:
    state = _state()
    v1 = _created(state)
    req = ResponsesRequest.model_validate({"model": "m", "input": "What is my name?", "conversation": v1.id})
    request = worker_pb2.SealedRequest(tenant="acme", model="m", endpoint="/v1/responses", history=[v1])
    turn = begin_sealed_turn(state, request, req)
    assert [m["content"] for m in turn.past] == ["My name is Ada."]
    head = turn.conversation_head()
    assert head is not None and (head.id, head.opened_version, head.version) == (v1.id, 1, 2)
    output = [{"id": "msg_1", "type": "message", "role": "assistant",
               "content": [{"type": "output_text", "text": "Ada."}]}]
    turn.keep(state, "acme", req, {"id": turn.response_id, "previous_response_id": None, "output": output})
    v2 = turn.conversation_stored
    assert v2 is not None and v2.id == v1.id
    _, items, _ = _call(state, "list_items", [v2], v2.id, query={"order": "asc"})
    assert [i["role"] for i in items["data"]] == ["user", "user", "assistant"]


def _forged(state: WorkerState, conv: worker_pb2.StateBlob, other: worker_pb2.StateBlob) -> list[worker_pb2.StateBlob]:
    forged = {**DOC, "kind": "conversation", "id": conv.id, "created_at": 1, "version": 9, "metadata": {},
              "items": []}  # what the gateway can have sealed in clear under any id (SealState): no mark
    return [worker_pb2.StateBlob(id=conv.id, blob=seal_state(state, "acme", conv.id, json.dumps(forged)))]


def _flipped(state: WorkerState, conv: worker_pb2.StateBlob, other: worker_pb2.StateBlob) -> list[worker_pb2.StateBlob]:
    return [worker_pb2.StateBlob(id=conv.id, blob=conv.blob[:-1] + bytes([conv.blob[-1] ^ 1]))]


# What an operator holding the gateway's database could send instead of the conversation named.
OPERATOR_CASES = {
    "another conversation": (lambda s, c, o: [o], 400, "state_mismatch"),
    "nothing": (lambda s, c, o: [], 400, "state_mismatch"),
    "two states": (lambda s, c, o: [c, o], 400, "state_mismatch"),
    "another conversation's blob under the id": (lambda s, c, o: [worker_pb2.StateBlob(id=c.id, blob=o.blob)],
                                                 404, "state_unreadable"),
    "a flipped bit": (_flipped, 404, "state_unreadable"),
    "a state sealed from clear text under the id": (_forged, 400, "state_mismatch"),
}


@pytest.mark.parametrize("case", OPERATOR_CASES)
def test_an_operator_cannot_send_another_conversation(case: str) -> None:
    state = _state()
    conv, other = _created(state), _created(state)
    tamper, status, code = OPERATOR_CASES[case]
    with pytest.raises(OpenAIError) as err:
        _call(state, "list_items", tamper(state, conv, other), conv.id)
    assert (err.value.status, err.value.code) == (status, code)
    req = ResponsesRequest.model_validate({"model": "m", "input": "hi", "conversation": conv.id})
    with pytest.raises(OpenAIError) as turn:
        begin_sealed_turn(state, worker_pb2.SealedRequest(tenant="acme", model="m", endpoint="/v1/responses",
                                                          history=tamper(state, conv, other)), req)
    assert (turn.value.status, turn.value.code, turn.value.param) == (status, code, "conversation")


def test_a_sealed_conversation_is_never_opened_for_a_plaintext_answer() -> None:
    state = _state()
    conv = _created(state)
    with pytest.raises(SealedOnlyState):
        open_state(state, "acme", conv.id, conv.blob)  # OpenState, as the plaintext routes would ask


def test_a_revoked_key_makes_it_unreadable() -> None:
    state = _state()
    conv = _created(state)
    state.live.booted = SimpleNamespace(engine=object(), released=SimpleNamespace(data_key=b""))  # type: ignore[assignment]
    with pytest.raises(OpenAIError) as err:
        _call(state, "retrieve", [conv], conv.id)
    assert (err.value.status, err.value.code) == (404, "state_unreadable")


@pytest.mark.parametrize(("op", "fields", "param"), [
    ("create", {"body": {"items": [{"type": "input_image", "image_url": "x"}]}}, "items[0].type"),
    ("create", {"body": {"metadata": {"k": "v" * 513}}}, "metadata"),
    ("create", {"body": {"colour": "red"}}, "colour"),
    ("create", {"model": "other"}, "model"),
    ("list_items", {"query": {"include": ["x"]}}, "include"),
    ("list_items", {"query": {"limit": 0}}, "limit"),
    ("update", {"body": {}}, "metadata"),
    ("create_items", {"body": {"items": []}}, "items"),
    ("rename", {}, "op"),
])
def test_a_malformed_call_is_refused_by_name_and_changes_nothing(op: str, fields: dict[str, Any], param: str) -> None:
    state = _state()
    conv = _created(state)
    with pytest.raises(OpenAIError) as err:
        _call(state, op, [] if op == "create" else [conv], None if op == "create" else conv.id, **fields)
    assert (err.value.status, err.value.param) == (400, param)


def test_a_tenant_that_keeps_nothing_gets_no_conversation() -> None:
    with pytest.raises(OpenAIError) as err:
        _created(_state(retention_days=0))
    assert err.value.status == 400 and "keeps no conversations" in err.value.message
