"""Stored responses through the real stack with the official openai SDK (plaintext): `store`
(default true), a two-turn run through `previous_response_id`, GET, input_items, DELETE (then
404); another tenant's id, an unknown id and a tampered blob are 404s; no plaintext of a stored
response in any file under the stack's home (its database holds ciphertext only)."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any as RunningStack

import openai
import pytest
from sqlalchemy import text

from api.home import Home
from api.stack import DEMO_MODEL
from api.store.db import make_engine, session_factory, sqlite_url
from api.store.repo import Store

ARGS = {"model": DEMO_MODEL, "temperature": 0, "max_output_tokens": 8}


def client(stack: RunningStack, api_key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=api_key or stack.api_key, max_retries=0)


def database(stack: RunningStack):  # type: ignore[no-untyped-def]
    return make_engine(sqlite_url(Home(stack.home).gateway))


def test_two_turns_get_input_items_and_delete(stack: RunningStack) -> None:
    c = client(stack)
    first = c.responses.create(input="My name is Ada. Remember it.", **ARGS)
    assert first.store is True and first.previous_response_id is None
    second = c.responses.create(input="What is my name?", previous_response_id=first.id, **ARGS)
    assert second.previous_response_id == first.id
    alone = c.responses.create(input="What is my name?", store=False, **ARGS)
    assert alone.store is False
    # The worker put the first turn (question and answer) before the second: the prompt is longer by it.
    assert second.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens

    got = c.responses.retrieve(first.id)
    assert (got.id, got.output_text, got.status) == (first.id, first.output_text, first.status)
    items = c.responses.input_items.list(second.id)
    assert [(i.type, i.role, i.content[0].text) for i in items.data] == [("message", "user", "What is my name?")]
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(alone.id)  # store: false keeps nothing

    c.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.delete(first.id)
    # The chain of the second response lost its first link: it cannot be continued any more.
    with pytest.raises(openai.NotFoundError) as gone:
        c.responses.create(input="And again?", previous_response_id=second.id, **ARGS)
    assert gone.value.body["param"] == "previous_response_id"  # type: ignore[index]


def test_streamed_response_is_stored(stack: RunningStack) -> None:
    c = client(stack)
    with c.responses.stream(input="Say hello.", **ARGS) as stream:
        events = list(stream)
    final = events[-1].response
    assert events[-1].type in ("response.completed", "response.incomplete") and final.store is True
    assert c.responses.retrieve(final.id).output_text == final.output_text


def test_unknown_and_other_tenants_ids_are_404(stack: RunningStack) -> None:
    c = client(stack)
    mine = c.responses.create(input="Hello.", **ARGS)
    store = Store(session_factory(database(stack)))
    other_secret, _ = store.create_key(f"globex-{secrets.token_hex(4)}", "stored-responses-test")
    other = client(stack, other_secret)
    for call in (lambda: other.responses.retrieve(mine.id), lambda: other.responses.delete(mine.id),
                 lambda: other.responses.input_items.list(mine.id), lambda: c.responses.retrieve("resp_unknown")):
        with pytest.raises(openai.NotFoundError):
            call()
    with pytest.raises(openai.NotFoundError):
        c.responses.create(input="Go on.", previous_response_id="resp_unknown", **ARGS)
    assert c.responses.retrieve(mine.id).id == mine.id  # still there for its owner


def test_a_tampered_or_moved_blob_does_not_open(stack: RunningStack) -> None:
    c = client(stack)
    a = c.responses.create(input="First.", **ARGS)
    b = c.responses.create(input="Second.", **ARGS)
    engine = database(stack)
    with engine.begin() as conn:
        blob_a = conn.execute(text("SELECT blob FROM response_states WHERE id = :i"), {"i": a.id}).scalar_one()
        flipped = bytes(blob_a[:-1]) + bytes([blob_a[-1] ^ 1])
        conn.execute(text("UPDATE response_states SET blob = :b WHERE id = :i"), {"b": flipped, "i": a.id})
        conn.execute(text("UPDATE response_states SET blob = :b WHERE id = :i"), {"b": bytes(blob_a), "i": b.id})
    for rid in (a.id, b.id):  # a changed bit; a's valid blob under b's id
        with pytest.raises(openai.NotFoundError) as refused:
            c.responses.retrieve(rid)
        assert refused.value.body["code"] == "state_unreadable"  # type: ignore[index]
        with pytest.raises(openai.BadRequestError):
            c.responses.create(input="Go on.", previous_response_id=rid, **ARGS)


def test_no_plaintext_of_a_stored_response_in_files(stack: RunningStack) -> None:
    canary = f"canary-{secrets.token_hex(8)}"
    c = client(stack)
    stored = c.responses.create(input=f"Repeat this word: {canary}", **ARGS)
    # Positive control: it is stored, and its owner reads the canary back through a worker.
    assert c.responses.input_items.list(stored.id).data[0].content[0].text.endswith(canary)  # type: ignore[union-attr]
    with database(stack).begin() as conn:
        assert conn.execute(text("SELECT count(*) FROM response_states WHERE id = :i"), {"i": stored.id}).scalar()
    needles = [canary.encode(), canary.encode("utf-16-le")]
    hits = [str(p) for p in Path(stack.home).rglob("*") if p.is_file()
            and any(n in p.read_bytes() for n in needles)]
    assert hits == []
