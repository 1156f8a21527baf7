"""A streamed file_search through SealedOpenAI and AsyncSealedOpenAI, sealed end to end against the
hostile-gateway double (test_client_negative.World): the sealed search, then the worker's sealed
event stream, opened and checked by the client; both receipts kept, the search's first. A search
answer the gateway alters sends no prompt; a stream it cuts or whose frame it alters raises
ResponseCorrupted while it is read, as the stream without the tool does, and never ends complete."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import httpx2
import pytest

from protocol.sealed import Receipt, RequestContext, ResponseCorrupted, api_key_id, open_request, sign_receipt
from protocol.sealed.http import HEADER_KEY_ID, HEADER_MODEL, SEARCH_ENDPOINT, ResponseHead
from sealed_client import AsyncSealedOpenAI, SealedOpenAI
from tests.sealed_client.test_client_negative import World, _drop, _flip, _frames
from tests.sealed_client.test_sealed_file_search_client import PAGES
from tests.sealed_client.test_sealed_file_search_stream import _events

TOOL = {"type": "file_search", "vector_store_ids": ["vs-b"], "max_num_results": 2}


class Gateway:
    """World's gateway and worker, serving a sealed search and a sealed streamed response."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.paths: list[str] = []
        self.search_edit: Callable[[bytes], bytes] | None = None
        self.stream_edit: Callable[[bytes], bytes] | None = None

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        path = request.url.path
        if path.startswith("/.well-known"):
            return self.world.handle(request)
        self.paths.append(path)
        search = path.endswith("/search")
        worker = self.world.workers[0]
        ctx = RequestContext("acme", request.headers[HEADER_MODEL], SEARCH_ENDPOINT if search else "/v1/responses",
                             request.headers[HEADER_KEY_ID], version="v1",
                             api_key_id=api_key_id(request.headers["authorization"].removeprefix("Bearer ")),
                             policy_version=self.world.workload.policy_version)
        opened = open_request(worker.key, ctx, request.read(), time.time(), worker.replay)
        sealer = opened.sealer
        if search:
            page = PAGES["vs-b"]
            head, chunks = ResponseHead(200, "application/json"), [json.dumps({"data": page}).encode()]
            file_ids = tuple(sorted({r["file_id"] for r in page}))
        else:
            stream = _events(json.loads(opened.body), None) + b"data: [DONE]\n\n"
            head, chunks, file_ids = ResponseHead(200, "text/event-stream"), [
                e + b"\n\n" for e in stream.split(b"\n\n") if e], ()
        out = sealer.header() + sealer.seal(head.encode()) + b"".join(sealer.seal(c) for c in chunks)
        receipt = Receipt(request_sha256=opened.request_sha256, response_sha256=sealer.hash.hexdigest(),
                          worker_key_id=worker.key.key_id, tenant="acme", model="m", model_version="v1",
                          model_digest="d", policy_version=ctx.policy_version, prompt_tokens=3, completion_tokens=2,
                          tee="sim", insecure=True, issued_at=time.time(), api_key_id=ctx.api_key_id,
                          signing_key=worker.usage_public.hex(), channel_spki="", evidence_sha256="e" * 64,
                          file_ids=file_ids)
        out += sealer.seal(sign_receipt(receipt, worker.usage), final=True)
        edit = self.search_edit if search else self.stream_edit
        return httpx2.Response(200, headers={"content-type": "application/sealed-response"},
                               content=edit(out) if edit else out)


def _clients(gateway: Gateway) -> tuple[SealedOpenAI, AsyncSealedOpenAI]:
    policy = gateway.world.policy()
    sync = SealedOpenAI(base_url="http://gw/v1", api_key="sk-test", policy=policy, max_retries=0,
                        retrieval_model="m", inner_transport=httpx2.MockTransport(gateway))
    async_ = AsyncSealedOpenAI(base_url="http://gw/v1", api_key="sk-test", policy=policy, max_retries=0,
                               retrieval_model="m", inner_transport=httpx2.MockTransport(gateway))
    return sync, async_


def _kinds_sync(client: SealedOpenAI) -> list[Any]:
    return list(client.responses.create(model="m", input="When?", stream=True, tools=[TOOL]))  # type: ignore[list-item]


def _kinds_async(client: AsyncSealedOpenAI) -> list[Any]:
    async def run() -> list[Any]:
        stream = await client.responses.create(model="m", input="When?", stream=True, tools=[TOOL])  # type: ignore[list-item]
        return [e async for e in stream]

    return asyncio.run(run())


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_streamed_sealed_file_search_end_to_end(mode: str) -> None:
    gateway = Gateway(World())
    sync, async_ = _clients(gateway)
    events = _kinds_sync(sync) if mode == "sync" else _kinds_async(async_)
    kinds = [e.type for e in events]
    assert kinds[2:7] == ["response.output_item.added", "response.file_search_call.in_progress",
                          "response.file_search_call.searching", "response.file_search_call.completed",
                          "response.output_item.done"]
    assert kinds.index("response.output_text.annotation.added") < kinds.index("response.output_text.done")
    final = events[-1].response
    assert final.output[0].type == "file_search_call"
    assert [a.file_id for a in final.output[1].content[0].annotations] == ["file-3"]
    assert gateway.paths == ["/v1/sealed/vector_stores/vs-b/search", "/v1/sealed/responses"]
    receipts = list((sync if mode == "sync" else async_).sealed.receipts)
    assert [r.file_ids for r in receipts] == [("file-3",), ()]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_altered_search_answer_sends_no_prompt(mode: str) -> None:
    gateway = Gateway(World())
    gateway.search_edit = _flip(40)
    sync, async_ = _clients(gateway)
    with pytest.raises(ResponseCorrupted):
        _kinds_sync(sync) if mode == "sync" else _kinds_async(async_)
    assert gateway.paths == ["/v1/sealed/vector_stores/vs-b/search"]


def _cut(body: bytes) -> bytes:
    return _drop(len(_frames(body)[1]) - 1)(body)  # the receipt, the stream's last frame


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("edit", [_cut, _flip(200)], ids=["cut before the receipt", "frame altered"])
def test_a_cut_or_altered_stream_raises_and_never_completes(mode: str, edit: Callable[[bytes], bytes]) -> None:
    gateway = Gateway(World())
    gateway.stream_edit = edit
    sync, async_ = _clients(gateway)
    seen: list[str] = []
    with pytest.raises(ResponseCorrupted):
        if mode == "sync":
            for event in sync.responses.create(model="m", input="When?", stream=True, tools=[TOOL]):  # type: ignore[list-item]
                seen.append(event.type)
        else:
            async def run() -> None:
                stream = await async_.responses.create(model="m", input="When?", stream=True,
                                                       tools=[TOOL])  # type: ignore[list-item]
                async for event in stream:
                    seen.append(event.type)

            asyncio.run(run())
    assert "response.completed" not in seen or edit is _cut  # a cut is known at the end only: it still raises
    assert len((sync if mode == "sync" else async_).sealed.receipts) == 1  # the search's only
