"""The gateway's side of stored responses and conversations over a real store, SQLite and (where
reachable) PostgreSQL (api/store/states.py, conversations.py, api/gateway/responses_store.py):
tenant scoping, chains, expiry (audited), the 400s and 404s a `previous_response_id` or a
`conversation` gets, and the input_items page."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from api.gateway.errors import GatewayError
from api.gateway.responses_store import StoredResponses, begin
from api.store.db import make_engine, session_factory, sqlite_url, upgrade
from api.store.repo import KeyRecord, Store
from api.store.states import ResponseStates
from policy.audit import AuditLog
from protocol.openai.items import input_items, page
from protocol.openai.responses_request import ResponsesRequest
from tests.api.fleet import postgres_database

DAY = dt.timedelta(days=1)


@pytest.fixture(params=["sqlite", "postgresql"])
def stored(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoredResponses]:
    cleanup = None if request.param == "sqlite" else postgres_database()
    engine = make_engine(sqlite_url(tmp_path) if cleanup is None else next(cleanup))
    upgrade(engine)
    yield StoredResponses(Store(session_factory(engine)), AuditLog(tmp_path / "gateway.jsonl",
                                                                   Ed25519PrivateKey.generate(), "gateway"))
    engine.dispose()
    if cleanup is not None:
        next(cleanup, None)


def _audited(stored: StoredResponses, action: str) -> list[str]:
    stored.audit.flush()
    entries = [json.loads(line) for line in stored.audit.path.read_text().splitlines()]
    return [e["metadata"]["response_id"] for e in entries if e["action"] == action]


def _key(tenant: str = "acme", models: tuple[str, ...] = ()) -> KeyRecord:
    return KeyRecord(key_id="key_a", tenant=tenant, name="k", models=models, expires_at=None, rpm=None, tpm=None,
                     priority=0, token_budget=None, tools_killed=False)


def _put(states: ResponseStates, state_id: str, previous: str | None = None, *, model: str = "m",
         version: str = "v1", retention: dt.timedelta = DAY, tenant: str = "acme") -> None:
    states.put(state_id=state_id, tenant=tenant, model=model, version=version, previous_id=previous,
               blob=b"\x01" + state_id.encode(), retention=retention)


def _req(**kw: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", "input": "hi", **kw})


def test_chain_oldest_first_and_scoped_to_the_tenant(stored: StoredResponses) -> None:
    _put(stored.states, "r1")
    _put(stored.states, "r2", "r1")
    _put(stored.states, "r3", "r2")
    turn = begin(stored, _key(), _req(previous_response_id="r3"), None)
    assert [s.id for s in turn.history] == ["r1", "r2", "r3"] and turn.store
    assert turn.pinned_split({"v0": 100.0}) == {"v1": 100.0}
    assert stored.states.chain("acme", "r3", limit=2) is None  # longer than allowed
    assert stored.states.get("globex", "r1") is None
    with pytest.raises(GatewayError) as other:
        stored.find(_key("globex"), "r1")
    assert other.value.status == 404
    stored.states.delete("acme", "r2")
    with pytest.raises(GatewayError) as broken:
        begin(stored, _key(), _req(previous_response_id="r3"), None)
    assert (broken.value.status, broken.value.param) == (404, "previous_response_id")


@pytest.mark.parametrize("case, status", [
    ("unknown id", 404), ("another tenant's id", 404), ("a model the key may not use", 404),
    ("another model", 400), ("two versions", 400), ("store under retention 0", 400)])
def test_previous_response_refusals(stored: StoredResponses, case: str, status: int) -> None:
    _put(stored.states, "r1", version="v0")
    _put(stored.states, "r2", "r1", version="v1" if case == "two versions" else "v0")
    _put(stored.states, "x1", tenant="globex")
    _put(stored.states, "o1", model="other")
    previous = {"unknown id": "nope", "another tenant's id": "x1", "another model": "o1"}.get(case, "r2")
    key = _key(models=("other",)) if case == "a model the key may not use" else _key()
    policy = {"payload": {"response_retention_days": 0}} if case == "store under retention 0" else None
    with pytest.raises(GatewayError) as refused:
        begin(stored, key, _req(previous_response_id=previous, store=case == "store under retention 0" or None),
              policy)
    assert refused.value.status == status


def test_retention_zero_by_default_stores_nothing(stored: StoredResponses) -> None:
    turn = begin(stored, _key(), _req(), {"payload": {"response_retention_days": 0}})
    assert not turn.store
    assert begin(stored, _key(), _req(store=False), None).store is False
    assert begin(stored, _key(), _req(), {"payload": {"response_retention_days": 3}}).retention == 3 * DAY


def test_expired_states_read_as_gone_and_their_purge_is_audited(stored: StoredResponses) -> None:
    _put(stored.states, "old", retention=dt.timedelta(seconds=-1))
    _put(stored.states, "new")
    assert stored.states.get("acme", "old") is None
    stored.purge_expired()
    assert stored.states.get("acme", "new") is not None
    assert _audited(stored, "response.expire") == ["old"]
    stored.delete(_key(), "new")
    assert _audited(stored, "response.delete") == ["new"]
    with pytest.raises(GatewayError):
        stored.delete(_key(), "new")


def test_input_items_and_their_page() -> None:
    items = input_items([{"role": "user", "content": "a"}, {"type": "function_call_output", "call_id": "c",
                                                            "output": "{}"}, {"role": "assistant", "content": "b"}])
    assert [i["id"][:3] for i in items] == ["msg", "fco", "msg"]
    assert items[0]["content"] == [{"type": "input_text", "text": "a"}]
    assert items[2]["content"] == [{"type": "output_text", "text": "b"}]
    desc = page(items, order="desc", after=None, limit=2)
    assert [i["id"] for i in desc["data"]] == [items[2]["id"], items[1]["id"]] and desc["has_more"]
    rest = page(items, order="desc", after=desc["last_id"], limit=2)
    assert [i["id"] for i in rest["data"]] == [items[0]["id"]] and not rest["has_more"]
    with pytest.raises(GatewayError):
        page(items, order="asc", after="nope", limit=2)


def test_conversations_scoped_bound_once_and_ordered(stored: StoredResponses) -> None:
    convs = stored.conversations
    conv = convs.create("conv_1", "acme", DAY)
    assert convs.get("globex", "conv_1") is None and convs.items("globex", "conv_1") == []
    assert not convs.add_items("globex", "conv_1", [("x", b"x")])
    assert convs.bind("acme", "conv_1", "m", "v1") and convs.bind("acme", "conv_1", "m", "v1")
    assert not convs.bind("acme", "conv_1", "m", "v2")  # bound once: its items share one key
    assert convs.add_items("acme", "conv_1", [("a", b"1"), ("b", b"2")]) and convs.add_items("acme", "conv_1",
                                                                                              [("c", b"3")])
    assert [(i.id, i.seq) for i in convs.items("acme", "conv_1")] == [("a", 1), ("b", 2), ("c", 3)]
    assert not convs.delete_item("globex", "conv_1", "b") and convs.delete_item("acme", "conv_1", "b")
    turn = begin(stored, _key(), _req(conversation=conv.id), None)
    assert [b.id for b in turn.history] == ["conv_1:a", "conv_1:c"] and turn.version == "v1"
    for fields, status in (({"conversation": "conv_2"}, 404), ({"conversation": "conv_1", "model": "m2"}, 400)):
        with pytest.raises(GatewayError) as refused:
            begin(stored, _key(), _req(**fields), None)
        assert (refused.value.status, refused.value.param) == (status, "conversation")
    with pytest.raises(GatewayError):
        begin(stored, _key("globex"), _req(conversation="conv_1"), None)
    assert not convs.delete("globex", "conv_1") and convs.delete("acme", "conv_1")
    assert convs.get("acme", "conv_1") is None and convs.items("acme", "conv_1") == []


def test_expired_conversations_go_with_their_items_audited(stored: StoredResponses) -> None:
    stored.conversations.create("conv_old", "acme", dt.timedelta(seconds=-1))
    stored.conversations.add_items("acme", "conv_old", [("a", b"1")])
    assert stored.conversations.get("acme", "conv_old") is None
    stored.purge_expired()
    assert stored.conversations.items("acme", "conv_old") == []
    stored.audit.flush()
    entries = [json.loads(line) for line in stored.audit.path.read_text().splitlines()]
    assert [e["metadata"]["conversation_id"] for e in entries if e["action"] == "conversation.expire"] == ["conv_old"]


def test_a_sealed_mode_conversation_is_one_blob_replaced_only_in_place_of_the_one_opened(
        stored: StoredResponses) -> None:
    conversations = stored.conversations
    conv = conversations.create_sealed("conv_s", "acme", "m", "v1", b"state-1", DAY)
    assert (conv.model, conv.version, conv.sealed_state) == ("m", "v1", b"state-1")
    assert conversations.items("acme", "conv_s") == []  # no item rows: the blob is the whole conversation
    assert conversations.replace_sealed("acme", "conv_s", b"state-1", b"state-2")
    assert not conversations.replace_sealed("acme", "conv_s", b"state-1", b"state-2b")  # a concurrent change
    assert not conversations.replace_sealed("globex", "conv_s", b"state-2", b"theirs")  # another tenant's
    found = conversations.get("acme", "conv_s")
    assert found is not None and found.sealed_state == b"state-2"
    assert conversations.get("globex", "conv_s") is None
    plain = conversations.create("conv_p", "acme", DAY)
    assert plain.sealed_state is None
    with pytest.raises(GatewayError) as refused:  # a plaintext continuation of a sealed-mode conversation
        begin(stored, _key(), ResponsesRequest.model_validate({"model": "m", "input": "hi", "conversation": "conv_s"}),
              {})
    assert (refused.value.status, refused.value.code) == (400, "sealed_only_state")
    assert conversations.delete("acme", "conv_s") and conversations.get("acme", "conv_s") is None


def test_the_gateway_keeps_only_what_the_worker_returns_for_the_conversation_it_sent(stored: StoredResponses) -> None:
    from types import SimpleNamespace

    from starlette.datastructures import Headers

    from api.gateway.sealed_conversations import keep_conversation, named_conversation
    from protocol.rpc import worker_pb2
    from protocol.sealed.http import CONVERSATIONS, HEADER_CONVERSATION

    service: Any = SimpleNamespace(responses=stored, catalog=SimpleNamespace(policy_document=lambda tenant: {}))
    key = _key()

    def chunk(conv_id: str, blob: bytes = b"sealed", version: str = "v1") -> worker_pb2.SealedChunk:
        return worker_pb2.SealedChunk(conversation_state=worker_pb2.StateBlob(id=conv_id, blob=blob),
                                      state_version=version)

    keep_conversation(service, key, "m", CONVERSATIONS, None, [], chunk("conv_new"))  # a create
    made = stored.conversations.get("acme", "conv_new")
    assert made is not None and (made.model, made.version, made.sealed_state) == ("m", "v1", b"sealed")
    sent = [worker_pb2.StateBlob(id="conv_new", blob=b"sealed")]
    keep_conversation(service, key, "m", CONVERSATIONS, "conv_new", sent, chunk("conv_new", b"sealed-2"))
    assert stored.conversations.get("acme", "conv_new").sealed_state == b"sealed-2"  # type: ignore[union-attr]
    refused = [
        (CONVERSATIONS, "conv_new", sent, chunk("conv_new", b"x"), 409),  # not the state kept now: a concurrent change
        (CONVERSATIONS, "conv_new", sent, chunk("conv_other", b"x"), 502),  # another conversation than it was sent
        ("/v1/responses", None, [], chunk("conv_made"), 502),  # a conversation the request did not ask to make
        (CONVERSATIONS, None, [], chunk("resp_1"), 502),  # not a conversation id
        (CONVERSATIONS, None, [], chunk("conv_x", b""), 502),  # no blob
        (CONVERSATIONS, None, [], chunk("conv_x", b"x", ""), 502),  # no version
    ]
    for endpoint, conv_id, history, answer, status in refused:
        with pytest.raises(GatewayError) as err:
            keep_conversation(service, key, "m", endpoint, conv_id, history, answer)
        assert err.value.status == status
    assert stored.conversations.get("acme", "conv_new").sealed_state == b"sealed-2"  # type: ignore[union-attr]
    assert stored.conversations.get("acme", "conv_made") is None
    assert named_conversation(CONVERSATIONS, Headers({HEADER_CONVERSATION: "conv_a"})) == "conv_a"
    for endpoint, value in (("/v1/chat/completions", "conv_a"), (CONVERSATIONS, "c" * 65),
                            (CONVERSATIONS, "conv_\u00e9")):
        with pytest.raises(GatewayError) as bad:
            named_conversation(endpoint, Headers({HEADER_CONVERSATION: value}))
        assert (bad.value.status, bad.value.param) == (400, "conversation")
