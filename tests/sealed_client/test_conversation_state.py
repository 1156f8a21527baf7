"""What SealedOpenAI does with conversations (sealed_client/conversation_state.py): every call but
deleting a conversation is sealed as an op on the conversation; the answer's sealed head must name
the conversation asked for, and a state older than (or other than) the newest this client saw is
refused as rolled back or replaced; the head's conversation round-trips and a malformed one is refused."""

from __future__ import annotations

import json

import httpx2
import pytest

from protocol.sealed.errors import ResponseCorrupted
from protocol.sealed.http import CONVERSATIONS, ConversationHead, ResponseHead
from sealed_client.conversation_state import ConversationMemory, call_body, conversation_op, named_conversation
from sealed_client.errors import ConversationMismatch, UnsealedRequest
from sealed_client.routing import route_of

RESPONSES = "/v1/responses"


def _head(opened: int, opened_digest: str, version: int, digest: str, conv_id: str = "conv_a") -> ResponseHead:
    return ResponseHead(200, "application/json", conversation=ConversationHead(conv_id, opened, opened_digest,
                                                                               version, digest))


@pytest.mark.parametrize(("method", "path", "op"), [
    ("POST", "/v1/conversations", ("create", None, None)),
    ("GET", "/v1/conversations/conv_a", ("retrieve", "conv_a", None)),
    ("POST", "/v1/conversations/conv_a", ("update", "conv_a", None)),
    ("GET", "/v1/conversations/conv_a/items", ("list_items", "conv_a", None)),
    ("POST", "/v1/conversations/conv_a/items", ("create_items", "conv_a", None)),
    ("GET", "/v1/conversations/conv_a/items/msg_1", ("retrieve_item", "conv_a", "msg_1")),
    ("DELETE", "/v1/conversations/conv_a/items/msg_1", ("delete_item", "conv_a", "msg_1")),
    ("DELETE", "/v1/conversations/conv_a", None),  # names an id, answers "deleted": nothing to seal
])
def test_each_conversation_call_is_sealed_but_deleting_one(method: str, path: str,
                                                           op: tuple[str, str | None, str | None] | None) -> None:
    assert conversation_op(method, path) == op
    route = route_of(httpx2.Request(method, f"https://gw.example/pfx{path}"), unsafe_allow_plaintext=True)
    assert route == (None if op is None else ("/pfx", CONVERSATIONS))


@pytest.mark.parametrize(("method", "path"), [("PUT", "/v1/conversations/conv_a"),
                                              ("DELETE", "/v1/conversations/conv_a/items"),
                                              ("GET", "/v1/conversations")])
def test_any_other_call_on_conversations_is_refused_before_sending(method: str, path: str) -> None:
    with pytest.raises(UnsealedRequest):
        route_of(httpx2.Request(method, f"https://gw.example{path}"), unsafe_allow_plaintext=True)


def test_the_call_body_carries_the_op_ids_query_and_body() -> None:
    body = call_body("list_items", "conv_a", None, [("limit", "5"), ("include[]", "x"), ("order", "asc")], b"", "m")
    assert json.loads(body) == {"model": "m", "op": "list_items", "conversation_id": "conv_a", "item_id": None,
                                "query": {"limit": 5, "include": ["x"], "order": "asc"}}
    assert named_conversation(CONVERSATIONS, body) == "conv_a"  # the id the gateway is told in clear
    created = call_body("create", None, None, [], b'{"items":[],"model":"m"}', "m")
    assert json.loads(created)["body"] == {"items": [], "model": "m"}
    assert named_conversation(CONVERSATIONS, created) is None


@pytest.mark.parametrize(("body", "expected"), [(b'{"conversation":"conv_a"}', "conv_a"),
                                                (b'{"conversation":{"id":"conv_a"}}', "conv_a"),
                                                (b'{"conversation":7}', None), (b'{"input":"hi"}', None),
                                                (b"not json", None), (b"[]", None)])
def test_the_conversation_of_a_responses_request(body: bytes, expected: str | None) -> None:
    assert named_conversation(RESPONSES, body) == expected
    assert named_conversation("/v1/chat/completions", body) is None


def test_the_head_round_trips_and_a_malformed_conversation_is_refused() -> None:
    head = _head(1, "d1", 2, "d2")
    assert ResponseHead.decode(head.encode()) == head
    for bad in ([1, 2], ["conv_a", -1, "", 1, "d"], ["conv_a", 1, "d", "2", "d"], "conv_a"):
        raw = json.dumps({"status": 200, "content_type": "a", "conversation": bad}).encode()
        with pytest.raises(ResponseCorrupted):
            ResponseHead.decode(raw)


def test_the_newest_state_seen_is_remembered_and_anything_older_refused() -> None:
    memory = ConversationMemory()
    memory.check(_head(0, "", 1, "d1"), CONVERSATIONS, None)  # created
    memory.check(_head(1, "d1", 1, "d1"), CONVERSATIONS, "conv_a")  # read
    memory.check(_head(1, "d1", 2, ""), RESPONSES, "conv_a")  # a streamed turn: the digest comes later
    memory.check(_head(2, "d2", 3, "d3"), CONVERSATIONS, "conv_a")  # v2's digest was not known: any is v2
    memory.check(_head(5, "d5", 5, "d5"), CONVERSATIONS, "conv_a")  # another client wrote meanwhile
    refused = [
        (_head(3, "d3", 4, "d4"), CONVERSATIONS, "conv_a"),  # rolled back to v3
        (_head(5, "dX", 5, "dX"), CONVERSATIONS, "conv_a"),  # another state of v5
        (_head(5, "d5", 7, "d7"), CONVERSATIONS, "conv_a"),  # a version a call cannot leave
        (_head(5, "d5", 5, "d5", "conv_b"), CONVERSATIONS, "conv_a"),  # another conversation
        (ResponseHead(200, "application/json"), RESPONSES, "conv_a"),  # a worker that states nothing
        (_head(5, "d5", 6, ""), RESPONSES, None),  # a conversation the request did not name
        (_head(1, "d1", 1, "d1"), CONVERSATIONS, None),  # a "create" that opened one
    ]
    for head, endpoint, asked in refused:
        with pytest.raises(ConversationMismatch):
            memory.check(head, endpoint, asked)
    memory.check(ResponseHead(404, "application/json"), CONVERSATIONS, "conv_a")  # a refusal opened nothing
    memory.check(ResponseHead(200, "application/json"), RESPONSES, None)
