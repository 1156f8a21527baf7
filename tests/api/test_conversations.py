"""The Conversations API through the real stack with the official openai SDK (plaintext): create
with items and metadata, retrieve, update, items list/create/retrieve/delete, a response in a
conversation (it continues from the items and adds its own), delete (then 404); another tenant's
id is a 404; nothing of a conversation in clear in the stack's files."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any as RunningStack

import openai
import pytest

from api.home import Home
from api.stack import DEMO_MODEL
from api.store.db import make_engine, session_factory, sqlite_url
from api.store.repo import Store

ARGS = {"model": DEMO_MODEL, "temperature": 0, "max_output_tokens": 8}


def client(stack: RunningStack, api_key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=api_key or stack.api_key, max_retries=0)


def test_conversation_crud_and_a_response_in_it(stack: RunningStack) -> None:
    canary = f"canary-{secrets.token_hex(8)}"
    c = client(stack)
    conv = c.conversations.create(items=[{"type": "message", "role": "user", "content": f"My name is {canary}."}],
                                  metadata={"topic": "names"})
    assert conv.id.startswith("conv_") and conv.metadata == {"topic": "names"}
    assert c.conversations.retrieve(conv.id).metadata == {"topic": "names"}
    assert c.conversations.update(conv.id, metadata={"topic": "ids"}).metadata == {"topic": "ids"}
    (first,) = c.conversations.items.list(conv.id).data
    assert first.type == "message" and first.content[0].text == f"My name is {canary}."  # type: ignore[union-attr]
    added = c.conversations.items.create(conv.id, items=[{"type": "message", "role": "assistant",
                                                          "content": "Noted."}])
    assert [i.role for i in added.data] == ["assistant"]  # type: ignore[union-attr]

    answer = c.responses.create(input="What is my name?", conversation=conv.id, **ARGS)
    assert answer.conversation is not None and answer.conversation.id == conv.id
    alone = c.responses.create(input="What is my name?", store=False, **ARGS)
    assert answer.usage.input_tokens > alone.usage.input_tokens + 5  # the worker put the items before it
    items = c.conversations.items.list(conv.id, order="asc").data
    assert [i.type for i in items][:3] == ["message"] * 3 and len(items) == 3 + len(answer.output)
    assert items[2].content[0].text == "What is my name?"  # type: ignore[union-attr]
    assert c.conversations.items.retrieve(items[1].id, conversation_id=conv.id).id == items[1].id

    assert c.conversations.items.delete(items[1].id, conversation_id=conv.id).id == conv.id
    with pytest.raises(openai.NotFoundError):
        c.conversations.items.retrieve(items[1].id, conversation_id=conv.id)
    assert len(c.conversations.items.list(conv.id).data) == len(items) - 1

    home = Home(stack.home)
    hits = [str(p) for p in Path(stack.home).rglob("*") if p.is_file() and canary.encode() in p.read_bytes()]
    assert hits == [] and home.gateway.exists()

    assert c.conversations.delete(conv.id).deleted
    for call in (lambda: c.conversations.retrieve(conv.id), lambda: c.conversations.items.list(conv.id),
                 lambda: c.responses.create(input="Again?", conversation=conv.id, **ARGS)):
        with pytest.raises(openai.NotFoundError):
            call()


def test_another_tenants_conversation_is_a_404(stack: RunningStack) -> None:
    c = client(stack)
    conv = c.conversations.create()
    store = Store(session_factory(make_engine(sqlite_url(Home(stack.home).gateway))))
    other_secret, _ = store.create_key(f"globex-{secrets.token_hex(4)}", "conversations-test")
    other = client(stack, other_secret)
    for call in (lambda: other.conversations.retrieve(conv.id), lambda: other.conversations.delete(conv.id),
                 lambda: other.conversations.items.list(conv.id),
                 lambda: other.conversations.update(conv.id, metadata={"a": "b"})):
        with pytest.raises(openai.NotFoundError):
            call()
    assert c.conversations.retrieve(conv.id).id == conv.id


def test_refusals(stack: RunningStack) -> None:
    c = client(stack)
    conv = c.conversations.create()
    with pytest.raises(openai.BadRequestError) as both:
        c.responses.create(input="hi", conversation=conv.id, previous_response_id="resp_x", **ARGS)
    assert both.value.body["param"] == "conversation"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as image:
        c.conversations.items.create(conv.id, items=[{"type": "input_image", "image_url": "x"}])
    assert image.value.body["param"] == "items[0].type"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        c.conversations.create(metadata={"k": "v" * 513})
    with pytest.raises(openai.NotFoundError):
        c.conversations.create(items=[{"role": "user", "content": "hi"}], extra_body={"model": "no-such-model"})
