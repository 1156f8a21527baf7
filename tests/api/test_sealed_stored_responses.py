"""Stored responses in sealed mode through the real stack with SealedOpenAI: `store` (default true)
and a two-turn run through `previous_response_id`; the gateway keeps ciphertext and ids only, so a
stored response's text is in no file under the stack's home (its database, logs, audit) and not in
the gateway's memory, while a plaintext one is there (the scan can fail); an operator who rewires the
chain in the gateway's database is refused; a sealed-mode state is read back only sealed (the worker
opens it), never in clear; another tenant's id is a 404; DELETE removes it (audited)."""

from __future__ import annotations

import json
import secrets
import time
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
from sealed_client import SealedOpenAI
from tests.api.plaintext_scan import memory_with_needles
from tests.api.sealed_helpers import demo_client_policy

ARGS: dict[str, Any] = {"model": DEMO_MODEL, "temperature": 0, "max_output_tokens": 8}


def sealed(stack: RunningStack) -> SealedOpenAI:
    return SealedOpenAI(base_url=f"{stack.url}/v1", api_key=stack.api_key, max_retries=0,
                        policy=demo_client_policy(stack.home))


def plain(stack: RunningStack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.api_key, max_retries=0)


def rows(stack: RunningStack, sql: str, **params: Any) -> list[Any]:
    engine = make_engine(sqlite_url(Home(stack.home).gateway))
    try:
        with engine.begin() as conn:
            return list(conn.execute(text(sql), params).all())
    finally:
        engine.dispose()


def test_two_sealed_turns_are_stored_as_ciphertext_with_routing_fields(stack: RunningStack) -> None:
    c = sealed(stack)
    first = c.responses.create(input="My name is Ada. Remember it.", **ARGS)
    assert first.store is True and first.previous_response_id is None
    second = c.responses.create(input="What is my name?", previous_response_id=first.id, **ARGS)
    assert second.store is True and second.previous_response_id == first.id and second.id != first.id
    alone = c.responses.create(input="What is my name?", store=False, **ARGS)
    assert alone.store is False
    # The worker put the first turn before the second: the prompt is longer by it.
    assert second.usage is not None and first.usage is not None and alone.usage is not None
    assert second.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens
    kept = {r[0]: r[1:] for r in rows(stack, "SELECT id, model, previous_id FROM response_states WHERE id IN "
                                             "(:a, :b, :c)", a=first.id, b=second.id, c=alone.id)}
    assert kept == {first.id: (DEMO_MODEL, None), second.id: (DEMO_MODEL, first.id)}  # store: false keeps nothing
    # Streamed, too: the state comes with the final chunk.
    with c.responses.stream(input="And again?", previous_response_id=second.id, **ARGS) as stream:
        final = [e for e in stream][-1].response
    assert final.previous_response_id == second.id
    assert rows(stack, "SELECT previous_id FROM response_states WHERE id = :i", i=final.id) == [(second.id,)]


def test_an_unknown_previous_response_or_conversation_is_404(stack: RunningStack) -> None:
    c = sealed(stack)
    with pytest.raises(openai.NotFoundError) as unknown:
        c.responses.create(input="Go on.", previous_response_id="resp_unknown", **ARGS)
    assert (unknown.value.body or {}).get("param") == "previous_response_id"  # type: ignore[union-attr]
    with pytest.raises(openai.NotFoundError) as conv:  # sealed conversations: tests/api/test_sealed_conversations.py
        c.responses.create(input="Go on.", conversation="conv_1", **ARGS)
    assert (conv.value.body or {}).get("param") == "conversation"  # type: ignore[union-attr]


def _rewire(stack: RunningStack, sql: str, **params: Any) -> None:
    engine = make_engine(sqlite_url(Home(stack.home).gateway))
    with engine.begin() as conn:
        conn.execute(text(sql), params)
    engine.dispose()


@pytest.mark.parametrize("attack", ["another chain behind the id", "another response's blob under the id"])
def test_an_operator_rewiring_the_chain_is_refused(stack: RunningStack, attack: str) -> None:
    c = sealed(stack)
    first = c.responses.create(input="First.", **ARGS)
    second = c.responses.create(input="Second.", previous_response_id=first.id, **ARGS)
    other = c.responses.create(input="Other.", **ARGS)
    if attack == "another chain behind the id":
        _rewire(stack, "UPDATE response_states SET previous_id = :o WHERE id = :i", o=other.id, i=second.id)
        error: type[openai.APIStatusError] = openai.BadRequestError
    else:
        [(blob,)] = rows(stack, "SELECT blob FROM response_states WHERE id = :i", i=other.id)
        _rewire(stack, "UPDATE response_states SET blob = :b WHERE id = :i", b=bytes(blob), i=second.id)
        error = openai.NotFoundError
    with pytest.raises(error) as refused:
        c.responses.create(input="Go on.", previous_response_id=second.id, **ARGS)
    assert (refused.value.body or {}).get("param") == "previous_response_id"  # type: ignore[union-attr]
    assert (refused.value.body or {}).get("code") in ("state_mismatch", "state_unreadable")  # type: ignore[union-attr]


def test_a_sealed_state_is_read_back_sealed_only_and_delete_removes_it(stack: RunningStack) -> None:
    c = sealed(stack)
    stored = c.responses.create(input="Keep this.", **ARGS)
    read = c.responses.retrieve(stored.id)  # opened by the worker, sealed to the client
    assert (read.id, read.output_text, read.store) == (stored.id, stored.output_text, True)
    receipt = c.sealed.receipts[-1]
    assert (receipt.prompt_tokens, receipt.completion_tokens) == (0, 0)  # a read runs no tokens, and is receipted
    items = c.responses.input_items.list(stored.id)
    assert [i.content[0].text for i in items.data] == ["Keep this."]  # type: ignore[union-attr]
    with pytest.raises(openai.BadRequestError) as include:
        c.responses.retrieve(stored.id, include=["message.input_image.image_url"])
    assert (include.value.body or {}).get("param") == "include"  # type: ignore[union-attr]
    for call in (lambda: plain(stack).responses.retrieve(stored.id),
                 lambda: plain(stack).responses.input_items.list(stored.id),
                 lambda: plain(stack).responses.create(input="Go on.", previous_response_id=stored.id, **ARGS)):
        with pytest.raises(openai.BadRequestError, match="stored in sealed mode"):
            call()  # the worker opens a sealed-mode state for no plaintext answer
    plain_stored = plain(stack).responses.create(input="In clear.", **ARGS)
    with pytest.raises(openai.BadRequestError, match="stored in plaintext mode"):
        c.responses.retrieve(plain_stored.id)  # the gateway could have sealed such a state under any id
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve("resp_unknown")
    c.responses.delete(stored.id)
    assert rows(stack, "SELECT id FROM response_states WHERE id = :i", i=stored.id) == []
    audit = Home(stack.home).audit / "gateway.audit.jsonl"
    assert any('"response.delete"' in line and stored.id in line
               for line in audit.read_text().splitlines())  # the deletion is audited
    for call in (lambda: c.responses.create(input="Go on.", previous_response_id=stored.id, **ARGS),
                 lambda: c.responses.retrieve(stored.id), lambda: c.responses.delete(stored.id)):
        with pytest.raises(openai.NotFoundError):
            call()


def test_another_tenants_stored_response_is_a_404_sealed(stack: RunningStack) -> None:
    stored = sealed(stack).responses.create(input="Mine.", **ARGS)
    store = Store(session_factory(make_engine(sqlite_url(Home(stack.home).gateway))))
    other_secret, _ = store.create_key(f"globex-{secrets.token_hex(4)}", "sealed-read-test")
    other = SealedOpenAI(base_url=f"{stack.url}/v1", api_key=other_secret, max_retries=0,
                         policy=demo_client_policy(stack.home))
    for call in (lambda: other.responses.retrieve(stored.id), lambda: other.responses.input_items.list(stored.id),
                 lambda: other.responses.delete(stored.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert sealed(stack).responses.retrieve(stored.id).id == stored.id


def test_canary_a_sealed_stored_response_is_in_no_file_and_not_in_the_gateways_memory(stack: RunningStack) -> None:
    home = Path(stack.home)
    gateway_pid = int(json.loads((home / "run" / "pids.json").read_text())["gateway"])
    canary = f"canary-sealed-state-{secrets.token_hex(8)}"
    c = sealed(stack)
    first = c.responses.create(input=f"Repeat this word: {canary}", **ARGS)
    c.responses.create(input=f"And this one: {canary}-2", previous_response_id=first.id, **ARGS)
    assert rows(stack, "SELECT count(*) FROM response_states WHERE id = :i", i=first.id) == [(1,)]
    plain_canary = f"canary-plain-state-{secrets.token_hex(8)}"  # positive control: the gateway saw this one
    plain(stack).responses.create(input=f"Repeat this word: {plain_canary}", **ARGS)
    time.sleep(1.0)  # usage rows and logs are written after the answer
    needles = [canary.encode(), canary.encode("utf-16-le")]
    files = [p for p in home.rglob("*") if p.is_file()]
    assert [str(p) for p in files if any(n in p.read_bytes() for n in needles)] == []
    assert memory_with_needles(gateway_pid, [plain_canary.encode()])  # the scan finds what is there
    assert memory_with_needles(gateway_pid, needles) == []
