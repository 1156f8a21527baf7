"""The Responses API's file_search tool through the real gateway and a real worker (real gRPC, the
real encoder, a stand-in chat model that records the prompt it is given) with the official openai
SDK: the passages reach the chat model before the input, labelled with their files; the answer has
a file_search_call item and file_citation annotations, whole and streamed; the search is audited
with its file ids; a caller without rights to a file never gets its passages into the prompt; an
unknown or another tenant's store is a 404 and a bad tool a 400 naming the field, with no search."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest

from api.gateway.retrieval_audit import file_ids_of
from enclave_worker.engine.config import RequestOutput, SamplingParams
from enclave_worker.engine.embedder import Embedder
from tests.api.retrieval_stack import (
    RetrievalStack,
    encoder_fixture,  # noqa: F401 (the fixture "encoder")
    retrieval_stack,
)
from tests.security.caller_harness import MODEL
from tests.security.stand_in_engine import StandInEngine

CANARY = "CANARY-fs-51c0de"
CONTRACT = f"The supplier contract ends on 31 March. Termination needs 90 days notice. {CANARY}"
HOLIDAYS = "Employees get 28 days of paid holiday a year, plus public holidays."
QUESTION = "When does the supplier contract end?"


@dataclass
class RecordingEngine(StandInEngine):
    """The stand-in chat model, keeping each prompt it is given (its tokenizer: one id per character)."""
    prompts: list[str] = field(default_factory=list)

    async def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                       cache_salt: bytes = b"") -> AsyncIterator[RequestOutput]:
        self.prompts.append("".join(chr(i) for i in prompt_token_ids))
        async for out in super().generate(request_id, prompt_token_ids, params, cache_salt):
            yield out


async def _loaded(stack: RetrievalStack) -> tuple[str, dict[str, str]]:
    c = stack.sdk()
    store = await c.vector_stores.create(name="policies")
    ids = {}
    for name, text, team in (("contract.txt", CONTRACT, "legal"), ("holidays.txt", HOLIDAYS, "hr")):
        uploaded = await c.files.create(file=(name, text.encode()), purpose="assistants")
        done = await c.vector_stores.files.create_and_poll(vector_store_id=store.id, file_id=uploaded.id,
                                                           attributes={"team": team})
        assert done.status == "completed", done
        ids[team] = done.id
    return store.id, ids


def _audit(stack: RetrievalStack) -> list[dict[str, Any]]:
    stack.service.audit.flush()
    return [json.loads(line) for line in stack.service.audit.path.read_text().splitlines()]


def _tool(store_id: str, **extra: Any) -> Any:
    return {"type": "file_search", "vector_store_ids": [store_id], **extra}


async def test_an_answer_grounded_in_the_store_cites_the_file(tmp_path: Path, encoder: Embedder) -> None:
    chat = RecordingEngine()
    async with retrieval_stack(tmp_path, encoder, chat_engine=chat) as stack:
        store_id, ids = await _loaded(stack)
        c = stack.sdk()
        answer = await c.responses.create(model=MODEL, input=QUESTION, instructions="Be brief.",
                                          tools=[_tool(store_id, max_num_results=1)],
                                          include=["file_search_call.results"])
        call, message = answer.output
        assert call.type == "file_search_call" and call.status == "completed" and call.queries == [QUESTION]
        assert call.results is not None and [r.file_id for r in call.results] == [ids["legal"]]
        assert message.type == "message" and message.content[0].type == "output_text"
        citations = message.content[0].annotations
        assert [(a.type, a.file_id, a.filename) for a in citations] == [  # type: ignore[union-attr]
            ("file_citation", ids["legal"], "contract.txt")]
        # The chat model read the passage, labelled, after the instructions and before the question.
        prompt = chat.prompts[-1]
        assert prompt.index("Be brief.") < prompt.index(f"[contract.txt]\n{CONTRACT}") < prompt.index(QUESTION)
        assert HOLIDAYS not in prompt  # max_num_results=1: only the best passage
        # Without the include, the item holds no results; a function tool beside it still reaches the model.
        plain = await c.responses.create(model=MODEL, input=QUESTION, tools=[
            _tool(store_id), {"type": "function", "name": "lookup", "parameters": {"type": "object"}}])
        assert plain.output[0].type == "file_search_call" and plain.output[0].results is None
        assert "lookup" in chat.prompts[-1]
        # Streamed: the SDK's file_search and annotation events, and the same final output.
        events = [e async for e in await c.responses.create(model=MODEL, input=QUESTION, stream=True,
                                                              tools=[_tool(store_id, max_num_results=1)])]
        kinds = [e.type for e in events]
        assert kinds.index("response.file_search_call.completed") < kinds.index("response.output_text.delta")
        assert "response.output_text.annotation.added" in kinds
        final = events[-1].response  # type: ignore[union-attr]
        assert final.output[1].content[0].annotations[0].file_id == ids["legal"]  # type: ignore[union-attr]
        # Each retrieval is audited as a vector store search is, with the file ids it gave.
        entries = _audit(stack)
        searches = [e["metadata"] for e in entries if e["action"] == "vector_store.search"]
        assert len(searches) == 3
        retrieved = [file_id for m in searches for file_id in file_ids_of(m)]
        assert retrieved.count(ids["legal"]) == 3 and CANARY not in json.dumps(entries)


async def test_a_caller_without_rights_never_gets_a_files_passages(tmp_path: Path, encoder: Embedder) -> None:
    def legal_only_for_the_tenant_key(tenant: str, reader: str) -> dict[str, Any]:
        return {"default": "allow", "rules": [{"attribute": "team", "value": "legal", "api_keys": [tenant]}]}

    chat = RecordingEngine()
    async with retrieval_stack(tmp_path, encoder, file_access=legal_only_for_the_tenant_key,
                               chat_engine=chat) as stack:
        store_id, ids = await _loaded(stack)
        reader = stack.sdk(stack.reader_key)
        for tool in (_tool(store_id), _tool(store_id, max_num_results=50),
                     _tool(store_id, filters={"type": "eq", "key": "team", "value": "legal"})):
            answer = await reader.responses.create(model=MODEL, input=QUESTION, tools=[tool],
                                                   include=["file_search_call.results"])
            call, message = answer.output
            assert ids["legal"] not in [r.file_id for r in call.results or []]  # type: ignore[union-attr]
            cited = [a.file_id for a in message.content[0].annotations]  # type: ignore[union-attr]
            assert ids["legal"] not in cited
            assert CANARY not in chat.prompts[-1] and "contract.txt" not in chat.prompts[-1]
        assert cited == [] and "no passages" in chat.prompts[-1]  # the legal filter: nothing it may read
        # The tenant's own key reads it: the rule, not the question, kept it out.
        mine = await stack.sdk().responses.create(model=MODEL, input=QUESTION, tools=[_tool(store_id)])
        assert ids["legal"] in [a.file_id for a in mine.output[1].content[0].annotations]  # type: ignore[union-attr]
        assert CANARY in chat.prompts[-1]


BAD_TOOLS: list[tuple[str, dict[str, Any], str]] = [
    ("three stores", {"vector_store_ids": ["vs-a", "vs-b", "vs-c"]}, "tools[0].vector_store_ids"),
    ("no store", {"vector_store_ids": []}, "tools[0].vector_store_ids"),
    ("zero results", {"max_num_results": 0}, "tools[0].max_num_results"),
    ("51 results", {"max_num_results": 51}, "tools[0].max_num_results"),
    ("unknown field", {"rewrite": True}, "tools[0].rewrite"),
]


async def test_bad_tools_unknown_and_foreign_stores_search_nothing(tmp_path: Path, encoder: Embedder) -> None:
    chat = RecordingEngine()
    async with retrieval_stack(tmp_path, encoder, chat_engine=chat) as stack:
        store_id, _ = await _loaded(stack)
        c = stack.sdk()
        for case, change, param in BAD_TOOLS:
            with pytest.raises(openai.BadRequestError) as bad:
                await c.responses.create(model=MODEL, input=QUESTION, tools=[{**_tool(store_id), **change}])
            assert bad.value.param == param, case
        with pytest.raises(openai.BadRequestError) as bad:
            await c.responses.create(model=MODEL, input=QUESTION, tools=[_tool(store_id)],
                                     include=["file_search_call.results", "message.output_text.logprobs"])
        assert bad.value.param == "include"
        globex, _ = stack.service.store.create_key("globex", "other")
        foreign = (await stack.sdk(globex).vector_stores.create(name="theirs")).id
        for unknown in ("vs-000000000000000000000000", foreign):
            with pytest.raises(openai.NotFoundError) as missing:
                await c.responses.create(model=MODEL, input=QUESTION,
                                         tools=[{"type": "file_search", "vector_store_ids": [store_id, unknown]}])
            assert missing.value.param == "tools[0].vector_store_ids"
        # None of them searched (nothing audited as a search) or reached the chat model.
        assert not [e for e in _audit(stack) if e["action"] == "vector_store.search"] and chat.prompts == []
