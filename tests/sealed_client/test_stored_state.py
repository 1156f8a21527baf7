"""What SealedOpenAI checks of a /v1/responses answer's stored history (sealed_client/stored_state.py):
the sealed head must state it continued exactly the previous_response_id the request named, and
nothing when it named none; the head's history and stored id round-trip, and a malformed one is
refused as a corrupted response."""

from __future__ import annotations

import json

import httpx2
import pytest

from protocol.sealed.errors import ResponseCorrupted
from protocol.sealed.http import STORED_READ, ResponseHead
from sealed_client.errors import HistoryMismatch, UnsealedRequest
from sealed_client.routing import route_of
from sealed_client.stored_state import check_history, previous_response_id, read_body

OK = ResponseHead(200, "application/json", ("resp_a", "resp_b"), "resp_c")


def test_the_head_round_trips_and_an_answer_without_state_encodes_as_before() -> None:
    assert ResponseHead.decode(OK.encode()) == OK
    assert ResponseHead(200, "application/json").encode() == b'{"status":200,"content_type":"application/json"}'


@pytest.mark.parametrize("raw", [b'{"status":200,"content_type":"a","history":"resp_a"}',
                                 b'{"status":200,"content_type":"a","history":[1]}',
                                 b'{"status":200,"content_type":"a","stored":7}', b'[1]'])
def test_a_malformed_head_is_refused(raw: bytes) -> None:
    with pytest.raises(ResponseCorrupted):
        ResponseHead.decode(raw)


def test_the_answer_continued_what_was_asked() -> None:
    check_history(OK, "resp_b")
    check_history(ResponseHead(200, "application/json"), None)
    check_history(ResponseHead(404, "application/json"), "resp_b")  # a refusal continued nothing


@pytest.mark.parametrize(("head", "asked"), [
    (OK, "resp_a"),  # the chain ends elsewhere
    (OK, None),  # history the request did not name
    (ResponseHead(200, "application/json"), "resp_b"),  # a worker that states nothing
    (ResponseHead(200, "text/event-stream", ("resp_x",)), "resp_b"),
])
def test_an_answer_that_continued_anything_else_is_refused(head: ResponseHead, asked: str | None) -> None:
    with pytest.raises(HistoryMismatch):
        check_history(head, asked)


@pytest.mark.parametrize(("endpoint", "body", "expected"), [
    ("/v1/responses", b'{"previous_response_id":"resp_1"}', "resp_1"),
    ("/v1/responses", b'{"input":"hi"}', None),
    ("/v1/responses", b'{"previous_response_id":7}', None),
    ("/v1/responses", b'not json', None),
    ("/v1/responses", b'[]', None),
    ("/v1/chat/completions", b'{"previous_response_id":"resp_1"}', None),
])
def test_the_id_named_to_the_gateway_is_the_sealed_one(endpoint: str, body: bytes, expected: str | None) -> None:
    assert previous_response_id(endpoint, body) == expected


@pytest.mark.parametrize(("method", "path", "route"), [
    ("DELETE", "/v1/responses/resp_1", None),  # names an id, answers "deleted": nothing to seal
    ("GET", "/v1/responses/resp_1", ("", STORED_READ)),
    ("GET", "/proxy/v1/responses/resp_1/input_items", ("/proxy", STORED_READ)),
])
def test_stored_responses_are_deleted_in_the_clear_and_read_back_sealed(method: str, path: str,
                                                                        route: tuple[str, str] | None) -> None:
    for unsafe in (False, True):  # a read is sealed even where the client may send plaintext
        assert route_of(httpx2.Request(method, f"https://gw.example{path}"), unsafe_allow_plaintext=unsafe) == route


@pytest.mark.parametrize(("method", "path"), [("DELETE", "/v1/responses/resp_1/input_items"),
                                              ("PUT", "/v1/responses/resp_1")])
def test_anything_else_on_a_stored_response_is_refused_before_sending(method: str, path: str) -> None:
    with pytest.raises(UnsealedRequest, match="nothing else"):
        route_of(httpx2.Request(method, f"https://gw.example{path}"), unsafe_allow_plaintext=False)


@pytest.mark.parametrize(("path", "query", "expected"), [
    ("/v1/responses/resp_1", [], {"response_id": "resp_1", "part": "response"}),
    ("/v1/responses/input_items", [], {"response_id": "input_items", "part": "response"}),
    ("/v1/responses/resp_1/input_items", [("limit", "5"), ("order", "asc"), ("after", "msg_1")],
     {"response_id": "resp_1", "part": "input_items", "limit": 5, "order": "asc", "after": "msg_1"}),
    ("/v1/responses/resp_1", [("include[]", "a"), ("include[]", "b"), ("stream", "true")],
     {"response_id": "resp_1", "part": "response", "include": ["a", "b"], "stream": True}),
    ("/v1/responses/resp_1/input_items", [("limit", "x")],  # sent as it is: the worker refuses it by name
     {"response_id": "resp_1", "part": "input_items", "limit": "x"}),
])
def test_a_stored_response_get_becomes_the_sealed_read_body(path: str, query: list[tuple[str, str]],
                                                            expected: dict[str, object]) -> None:
    body = read_body(path, query, "m")
    assert json.loads(body) == {"model": "m", **expected}
    assert previous_response_id(STORED_READ, body) == expected["response_id"]  # the id named in clear
