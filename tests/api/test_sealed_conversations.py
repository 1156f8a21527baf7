"""Conversations in sealed mode through the real stack with SealedOpenAI: create, read, update, items
and turns in the conversation, with the conversation sealed by the worker and kept by the gateway as
one blob and an id; a conversation made in sealed mode is never served in clear; an operator who
rolls the conversation back or puts another one's state under its id is caught; another tenant's id
is a 404; DELETE removes it (audited); its text is in no file under the stack's home."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any
from typing import Any as RunningStack

import openai
import pytest
from sqlalchemy import text

from api.home import Home
from api.stack import DEMO_MODEL
from api.store.db import make_engine, session_factory, sqlite_url
from api.store.repo import Store
from sealed_client import AsyncSealedOpenAI, SealedOpenAI
from sealed_client.errors import ConversationMismatch
from tests.api.sealed_helpers import demo_client_policy

ARGS: dict[str, Any] = {"model": DEMO_MODEL, "temperature": 0, "max_output_tokens": 8}
MODEL = {"model": DEMO_MODEL}


def sealed(stack: RunningStack, api_key: str | None = None) -> SealedOpenAI:
    return SealedOpenAI(base_url=f"{stack.url}/v1", api_key=api_key or stack.api_key, max_retries=0,
                        policy=demo_client_policy(stack.home))


def plain(stack: RunningStack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.api_key, max_retries=0)


def sql(stack: RunningStack, statement: str, **params: Any) -> list[Any]:
    engine = make_engine(sqlite_url(Home(stack.home).gateway))
    try:
        with engine.begin() as conn:
            result = conn.execute(text(statement), params)
            return list(result.all()) if result.returns_rows else []
    finally:
        engine.dispose()


def test_a_sealed_conversation_crud_and_turns(stack: RunningStack) -> None:
    canary = f"canary-sealed-conv-{secrets.token_hex(8)}"
    c = sealed(stack)
    conv = c.conversations.create(items=[{"type": "message", "role": "user", "content": f"My name is {canary}."}],
                                  metadata={"topic": "names"}, extra_body=MODEL)
    assert conv.id.startswith("conv_") and conv.metadata == {"topic": "names"}
    assert c.conversations.retrieve(conv.id).metadata == {"topic": "names"}
    assert c.conversations.update(conv.id, metadata={"topic": "ids"}).metadata == {"topic": "ids"}
    added = c.conversations.items.create(conv.id, items=[{"type": "message", "role": "assistant",
                                                          "content": "Noted."}])
    assert [i.role for i in added.data] == ["assistant"]  # type: ignore[union-attr]

    answer = c.responses.create(input="What is my name?", conversation=conv.id, **ARGS)
    assert answer.conversation is not None and answer.conversation.id == conv.id
    alone = c.responses.create(input="What is my name?", store=False, **ARGS)
    assert answer.usage is not None and alone.usage is not None
    assert answer.usage.input_tokens > alone.usage.input_tokens + 5  # the worker put the items before it
    with c.responses.stream(input="Again?", conversation=conv.id, **ARGS) as stream:
        assert [e for e in stream][-1].response.conversation.id == conv.id  # type: ignore[union-attr]
    items = c.conversations.items.list(conv.id, order="asc").data
    assert len(items) == 2 + 1 + len(answer.output) + 1 + 1  # both turns' input and output were added
    assert items[0].content[0].text == f"My name is {canary}."  # type: ignore[union-attr]
    assert items[2].content[0].text == "What is my name?"  # type: ignore[union-attr]
    assert c.conversations.items.retrieve(items[1].id, conversation_id=conv.id).id == items[1].id
    assert c.conversations.items.delete(items[1].id, conversation_id=conv.id).id == conv.id
    with pytest.raises(openai.NotFoundError):
        c.conversations.items.retrieve(items[1].id, conversation_id=conv.id)

    # The gateway keeps one blob and routing fields: no item rows, no clear text anywhere under the home.
    [(model, blob)] = sql(stack, "SELECT model, sealed_state FROM conversations WHERE id = :i", i=conv.id)
    assert model == DEMO_MODEL and blob and canary.encode() not in bytes(blob)
    assert sql(stack, "SELECT count(*) FROM conversation_items WHERE conversation_id = :i", i=conv.id) == [(0,)]
    hits = [str(p) for p in Path(stack.home).rglob("*") if p.is_file() and canary.encode() in p.read_bytes()]
    assert hits == []

    # Never in clear: the plaintext routes refuse it by name (and the worker would not open it for them).
    p = plain(stack)
    for call in (lambda: p.conversations.retrieve(conv.id), lambda: p.conversations.items.list(conv.id),
                 lambda: p.conversations.items.create(conv.id, items=[{"role": "user", "content": "x"}]),
                 lambda: p.responses.create(input="Go on.", conversation=conv.id, **ARGS)):
        with pytest.raises(openai.BadRequestError) as refused:
            call()
        assert (refused.value.body or {}).get("code") == "sealed_only_state"  # type: ignore[union-attr]

    assert c.conversations.delete(conv.id).deleted
    audit = Home(stack.home).audit / "gateway.audit.jsonl"
    assert any('"conversation.delete"' in line and conv.id in line for line in audit.read_text().splitlines())
    assert sql(stack, "SELECT count(*) FROM conversations WHERE id = :i", i=conv.id) == [(0,)]
    for call in (lambda: c.conversations.retrieve(conv.id), lambda: c.conversations.items.list(conv.id),
                 lambda: c.responses.create(input="Again?", conversation=conv.id, **ARGS)):
        with pytest.raises(openai.NotFoundError):
            call()


def test_an_operator_rolling_back_or_swapping_the_conversation_is_caught(stack: RunningStack) -> None:
    c = sealed(stack)
    conv = c.conversations.create(items=[{"role": "user", "content": "One."}], extra_body=MODEL)
    other = c.conversations.create(items=[{"role": "user", "content": "Other."}], extra_body=MODEL)
    [(v1,)] = sql(stack, "SELECT sealed_state FROM conversations WHERE id = :i", i=conv.id)
    c.conversations.items.create(conv.id, items=[{"role": "user", "content": "Two."}])
    assert len(c.conversations.items.list(conv.id).data) == 2
    sql(stack, "UPDATE conversations SET sealed_state = :b WHERE id = :i", b=bytes(v1), i=conv.id)  # rolled back
    with pytest.raises(ConversationMismatch, match="rolled back"):
        c.conversations.items.list(conv.id)
    with pytest.raises(ConversationMismatch, match="rolled back"):
        c.responses.create(input="Go on.", conversation=conv.id, **ARGS)
    [(theirs,)] = sql(stack, "SELECT sealed_state FROM conversations WHERE id = :i", i=other.id)
    sql(stack, "UPDATE conversations SET sealed_state = :b WHERE id = :i", b=bytes(theirs), i=conv.id)
    with pytest.raises(openai.NotFoundError) as swapped:
        c.conversations.items.list(conv.id)  # the blob is bound to the other id: it does not open
    assert (swapped.value.body or {}).get("code") == "state_unreadable"  # type: ignore[union-attr]


def test_another_tenants_conversation_is_a_404_and_a_plaintext_one_is_not_continued_sealed(
        stack: RunningStack) -> None:
    c = sealed(stack)
    conv = c.conversations.create(extra_body=MODEL)
    store = Store(session_factory(make_engine(sqlite_url(Home(stack.home).gateway))))
    other_secret, _ = store.create_key(f"globex-{secrets.token_hex(4)}", "sealed-conversations-test")
    other = sealed(stack, other_secret)
    for call in (lambda: other.conversations.retrieve(conv.id), lambda: other.conversations.delete(conv.id),
                 lambda: other.conversations.items.list(conv.id),
                 lambda: other.conversations.update(conv.id, metadata={"a": "b"})):
        with pytest.raises(openai.NotFoundError):
            call()
    assert c.conversations.retrieve(conv.id).id == conv.id
    in_clear = plain(stack).conversations.create(items=[{"role": "user", "content": "hi"}], extra_body=MODEL)
    with pytest.raises(openai.BadRequestError, match="plaintext mode"):
        c.responses.create(input="Go on.", conversation=in_clear.id, **ARGS)
    with pytest.raises(openai.BadRequestError) as no_model:
        c.conversations.create()  # sealed under a model's key: the client cannot seal without one
    assert (no_model.value.body or {}).get("param") == "model"  # type: ignore[union-attr]
    with pytest.raises(openai.BadRequestError) as both:
        c.responses.create(input="hi", conversation=conv.id, previous_response_id="resp_x", **ARGS)
    assert (both.value.body or {}).get("param") == "conversation"  # type: ignore[union-attr]


def test_the_async_client_seals_conversations_and_reads_back_alike(stack: RunningStack) -> None:
    import asyncio

    async def go() -> tuple[int, str, str]:
        c = AsyncSealedOpenAI(base_url=f"{stack.url}/v1", api_key=stack.api_key, max_retries=0,
                              policy=demo_client_policy(stack.home))
        conv = await c.conversations.create(items=[{"role": "user", "content": "Hello."}], extra_body=MODEL)
        items = await c.conversations.items.list(conv.id)
        stored = await c.responses.create(input="Keep this.", **ARGS)
        read = await c.responses.retrieve(stored.id)
        return len(items.data), read.id, stored.id

    count, read_id, stored_id = asyncio.run(go())
    assert count == 1 and read_id == stored_id
