"""Files and vector stores through the real gateway and a real worker (real gRPC, the real encoder)
with the official openai SDK: files.create, vector_stores.create, files.upload_and_poll, search
(filters, threshold), file batches, deletion gone at once; another tenant's ids 404 alike; the
operator's own key gets no passages; bad requests refused with nothing changed; and a canary
document's text is in no file the gateway writes, no log line and no row of its database."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import openai
import pytest

from api.gateway.retrieval_audit import file_ids_of
from enclave_worker.engine.embedder import Embedder
from tests.api.retrieval_stack import (
    RetrievalStack,
    encoder_fixture,  # noqa: F401 (the fixture "encoder")
    retrieval_stack,
    stack_fixture,  # noqa: F401 (the fixture "stack")
)

CANARY = "CANARY-vs-9d41e7"
CONTRACT = f"The supplier contract ends on 31 March. Termination needs 90 days notice. {CANARY}"
HOLIDAYS = "Employees get 28 days of paid holiday a year, plus public holidays."


async def _loaded(stack: RetrievalStack) -> tuple[str, dict[str, str]]:
    c = stack.sdk()
    store = await c.vector_stores.create(name="policies")
    ids = {}
    for name, text, team in (("contract.txt", CONTRACT, "legal"), ("holidays.txt", HOLIDAYS, "hr")):
        done = await c.vector_stores.files.upload_and_poll(vector_store_id=store.id, file=(name, text.encode()))
        assert done.status == "completed" and done.last_error is None, done
        ids[team] = done.id
    return store.id, ids


async def test_upload_search_and_delete_with_the_sdk(stack: RetrievalStack, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    c = stack.sdk()
    store_id, ids = await _loaded(stack)
    page = await c.vector_stores.search(store_id, query="When does the supplier contract end?", max_num_results=2)
    assert page.data[0].file_id == ids["legal"] and CANARY in page.data[0].content[0].text
    assert page.data[0].filename == "contract.txt" and 0 < page.data[0].score <= 1

    listed = await c.vector_stores.files.list(store_id)
    assert sorted(f.id for f in listed.data) == sorted(ids.values())
    got = await c.vector_stores.retrieve(store_id)
    assert got.file_counts.completed == 2 and got.usage_bytes == len(CONTRACT) + len(HOLIDAYS)
    assert (await c.files.retrieve(ids["legal"])).bytes == len(CONTRACT)

    await c.vector_stores.files.delete(file_id=ids["legal"], vector_store_id=store_id)
    after = await c.vector_stores.search(store_id, query="When does the supplier contract end?")
    assert ids["legal"] not in [r.file_id for r in after.data]  # gone from the index at once
    assert all(CANARY not in r.content[0].text for r in after.data)
    with pytest.raises(openai.NotFoundError):
        await c.vector_stores.files.retrieve(file_id=ids["legal"], vector_store_id=store_id)

    # The canary is nowhere the gateway writes: its database and files, its logs.
    question = b"supplier contract end"
    for path in stack.data_dir.rglob("*"):
        if path.is_file():
            assert CANARY.encode() not in path.read_bytes() and question not in path.read_bytes(), path
    assert CANARY not in caplog.text and question.decode() not in caplog.text
    # Every search was audited with the ids of the files its passages came from.
    audit = stack.service.audit
    audit.flush()
    entries = [json.loads(line) for line in audit.path.read_text().splitlines()]
    searches = [e["metadata"] for e in entries if e["action"] == "vector_store.search"]
    assert len(searches) == 2 and len({m["search_id"] for m in searches}) == 2
    # One signed entry a search, naming each file that gave passages (api/gateway/retrieval_audit.py).
    assert [file_ids_of(m) for m in searches] == [sorted({r.file_id for r in page.data}),
                                                  sorted({r.file_id for r in after.data})]
    assert [m["files"] for m in searches] == [len(file_ids_of(m)) for m in searches]
    assert all(file_ids_of(m) for m in searches)  # each search found something
    assert CANARY not in audit.path.read_text()


async def test_batches_attributes_filters_and_threshold(stack: RetrievalStack) -> None:
    c = stack.sdk()
    legal = await c.files.create(file=("contract.txt", CONTRACT.encode()), purpose="assistants")
    hr = await c.files.create(file=("holidays.txt", HOLIDAYS.encode()), purpose="user_data")
    store = await c.vector_stores.create(name="s")
    batch = await c.vector_stores.file_batches.create(store.id, file_ids=[legal.id], attributes={"team": "legal"})
    assert batch.status == "completed" and batch.file_counts.completed == 1
    assert (await c.vector_stores.file_batches.retrieve(batch.id, vector_store_id=store.id)).id == batch.id
    await c.vector_stores.files.create(store.id, file_id=hr.id, attributes={"team": "hr"},
                                       chunking_strategy={"type": "static", "static": {
                                           "max_chunk_size_tokens": 200, "chunk_overlap_tokens": 100}})
    only_hr = await c.vector_stores.search(store.id, query="contract", filters={"type": "eq", "key": "team",
                                                                                  "value": "hr"})
    assert [r.file_id for r in only_hr.data] == [hr.id]
    strict = await c.vector_stores.search(store.id, query="contract", ranking_options={"score_threshold": 0.99})
    assert strict.data == []
    with pytest.raises(openai.BadRequestError):
        await c.files.content(legal.id)  # a document is opened only inside a worker
    await c.vector_stores.delete(store.id)
    with pytest.raises(openai.NotFoundError):
        await c.vector_stores.retrieve(store.id)


async def test_another_tenant_and_the_operators_key_get_nothing(stack: RetrievalStack) -> None:
    store_id, ids = await _loaded(stack)
    other, _ = stack.service.store.create_key("globex", "other")
    g = stack.sdk(other)
    for call in (g.vector_stores.retrieve(store_id), g.files.retrieve(ids["legal"]),
                 g.vector_stores.search(store_id, query="contract"), g.vector_stores.delete(store_id),
                 g.files.delete(ids["hr"]), g.vector_stores.files.list(store_id),
                 g.vector_stores.files.retrieve(file_id=ids["hr"], vector_store_id=store_id)):
        with pytest.raises(openai.NotFoundError):
            await call
    assert (await g.vector_stores.list()).data == [] and (await g.files.list()).data == []
    # A key the operator made for the tenant is not in the tenant's signed caller policy: no passages.
    operator = stack.sdk(await stack.operator_key())
    with pytest.raises(openai.PermissionDeniedError):
        await operator.vector_stores.search(store_id, query="contract")
    c = stack.sdk()
    assert len((await c.vector_stores.search(store_id, query="contract")).data) == 2  # nothing changed


REFUSED: list[tuple[str, dict[str, Any]]] = [
    ("rewrite_query", {"rewrite_query": True}),
    ("two queries", {"query": ["a", "b"]}),
    ("51 results", {"max_num_results": 51}),
    ("unknown filter", {"filters": {"type": "like", "key": "team", "value": "x"}}),
    ("threshold over 1", {"ranking_options": {"score_threshold": 2.0}}),
    ("unknown field", {"boost": 2}),
]


@pytest.mark.parametrize("case,change", REFUSED, ids=[c for c, _ in REFUSED])
async def test_bad_searches_are_400(stack: RetrievalStack, case: str, change: dict[str, Any]) -> None:
    store_id, _ = await _loaded(stack)
    answer = await stack.http.post(f"/v1/vector_stores/{store_id}/search", json={"query": "contract", **change},
                                   headers={"Authorization": f"Bearer {stack.tenant_key}"})
    assert answer.status_code in (400, 422) and CANARY not in answer.text, answer.text


async def test_bad_files_and_attachments_change_nothing(stack: RetrievalStack) -> None:
    c = stack.sdk()
    store_id, _ = await _loaded(stack)
    with pytest.raises(openai.BadRequestError):
        await c.files.create(file=("x.txt", b"x"), purpose="fine-tune")  # type: ignore[arg-type]
    fresh = await c.files.create(file=("more.txt", b"More text about parking."), purpose="assistants")
    with pytest.raises(openai.BadRequestError):  # over the embedding model's window
        await c.vector_stores.files.create(store_id, file_id=fresh.id, chunking_strategy={
            "type": "static", "static": {"max_chunk_size_tokens": 4096, "chunk_overlap_tokens": 0}})
    with pytest.raises(openai.NotFoundError):
        await c.vector_stores.files.create(store_id, file_id="file-nonexistent")
    with pytest.raises(openai.NotFoundError):  # every file is checked before the store exists
        await c.vector_stores.create(name="new", file_ids=[fresh.id, "file-nonexistent"])
    for metadata in ({"k" * 65: "v"}, {"k": "v" * 513}, {f"k{i}": "v" for i in range(17)}):
        with pytest.raises((openai.BadRequestError, openai.UnprocessableEntityError)):
            await c.vector_stores.create(name="new", metadata=metadata)
    assert [s.id for s in (await c.vector_stores.list()).data] == [store_id]
    with pytest.raises(openai.NotFoundError):
        await c.vector_stores.files.retrieve(file_id=fresh.id, vector_store_id=store_id)  # the refusal kept nothing
    binary = await c.files.create(file=("x.bin", b"\xff\xfe\x00\x01"), purpose="assistants")
    failed = await c.vector_stores.files.create(store_id, file_id=binary.id)
    assert failed.status == "failed" and failed.last_error is not None
    assert failed.last_error.code == "unsupported_file"
    got = await c.vector_stores.retrieve(store_id)
    assert (got.file_counts.completed, got.file_counts.failed) == (2, 1)
    assert len((await c.vector_stores.search(store_id, query="contract")).data) == 2


async def test_a_caller_without_rights_never_receives_a_files_passages(tmp_path: Path, encoder: Embedder) -> None:
    def legal_only_for_the_tenant_key(tenant: str, reader: str) -> dict[str, Any]:
        return {"default": "allow", "rules": [{"attribute": "team", "value": "legal", "api_keys": [tenant]}]}

    async with retrieval_stack(tmp_path, encoder, file_access=legal_only_for_the_tenant_key) as stack:
        c, reader = stack.sdk(), stack.sdk(stack.reader_key)
        legal = await c.files.create(file=("contract.txt", CONTRACT.encode()), purpose="assistants")
        hr = await c.files.create(file=("holidays.txt", HOLIDAYS.encode()), purpose="assistants")
        store = await c.vector_stores.create(name="s")
        await c.vector_stores.files.create(store.id, file_id=legal.id, attributes={"team": "legal"})
        await c.vector_stores.files.create(store.id, file_id=hr.id, attributes={"team": "hr"})
        question = "When does the supplier contract end?"
        assert (await c.vector_stores.search(store.id, query=question, max_num_results=1)).data[0].file_id == legal.id
        for kwargs in ({}, {"filters": {"type": "eq", "key": "team", "value": "legal"}}, {"max_num_results": 50}):
            page = await reader.vector_stores.search(store.id, query=question, **kwargs)  # type: ignore[arg-type]
            assert legal.id not in [r.file_id for r in page.data]
            assert all(CANARY not in r.content[0].text for r in page.data)
        assert [r.file_id for r in (await reader.vector_stores.search(store.id, query=question)).data] == [hr.id]


async def test_an_empty_store_and_a_tenant_without_an_embedding_model(tmp_path: Path) -> None:
    async with retrieval_stack(tmp_path, None) as stack:  # the worker serves a chat model only
        c = stack.sdk()
        store = await c.vector_stores.create(name="empty")
        assert (await c.vector_stores.search(store.id, query="anything")).data == []
        with pytest.raises(openai.InternalServerError) as refused:
            await c.files.create(file=("a.txt", CONTRACT.encode()), purpose="assistants")
        assert refused.value.status_code == 503 and CANARY not in str(refused.value.body)
        assert (await c.files.list()).data == []  # nothing kept


async def test_a_large_upload_never_touches_the_disk(stack: RetrievalStack, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    spilled: list[object] = []
    real = tempfile.TemporaryFile

    def recording(*args: Any, **kwargs: Any) -> Any:
        spilled.append(args)
        return real(*args, **kwargs)

    # Starlette spools an upload over 1 MiB to a temporary file unless told not to.
    monkeypatch.setattr(tempfile, "TemporaryFile", recording)
    big = (CONTRACT + "\n") * (2 * 1024 * 1024 // len(CONTRACT))
    created = await stack.sdk().files.create(file=("big.txt", big.encode()), purpose="assistants")
    assert created.bytes == len(big) and spilled == []
    for bad in ({"purpose": "assistants"}, {"file": ("a.txt", b"x")}):  # a part missing
        answer = await stack.http.post("/v1/files", headers={"Authorization": f"Bearer {stack.tenant_key}"},
                                       files={"file": bad["file"]} if "file" in bad else None,
                                       data={"purpose": bad["purpose"]} if "purpose" in bad else None)
        assert answer.status_code == 400, answer.text


async def test_a_revoked_key_makes_the_store_unreadable_at_once(stack: RetrievalStack) -> None:
    store_id, _ = await _loaded(stack)
    c = stack.sdk()
    assert (await c.vector_stores.search(store_id, query="contract")).data  # opened once: in the worker's cache
    stack.state.booted.released.data_key = b""  # type: ignore[union-attr]  # revoked: the worker wiped its key
    with pytest.raises(openai.ConflictError) as refused:
        await c.vector_stores.search(store_id, query="contract")
    assert CANARY not in str(refused.value.body)
    with pytest.raises(openai.ConflictError):
        await c.files.create(file=("x.txt", b"new text"), purpose="assistants")  # nothing new is sealed
    assert len((await c.files.list()).data) == 2
