"""The stack's side of `sealed bench retrieval --stack-url`: the same files uploaded, attached to a
vector store and searched through a running stack's HTTP API with the official openai SDK, so the
figures include everything the boundary adds (the gateway, gRPC, the worker's sealing of each file,
the store snapshot the worker reseals whole on every ingest and the gateway reads back and stores,
and on every search the gateway's row read and the store named to the worker, which holds it open).

Searches are timed two ways: with the SDK, and as bare HTTP (`search_http`: one kept-alive httpx
connection, the SDK's JSON body, the reply's JSON parsed). The cost of the boundary (issue 51) is
the HTTP figure: the SDK's own request building and response models are the caller's library, not
the stack, and the plain side has no client at all (docs/retrieval.md "The cost of the boundary")."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import httpx
import openai

from enclave_worker.retrieval.filters import Scalar


class StackSideError(RuntimeError):
    """The stack refused or failed a step of the benchmark (the message says which)."""


@dataclass
class StackSide:
    """One vector store on the stack, filled file by file; ``keys`` maps a passage the stack returns
    (its file id and text) to the plain side's chunk keys, so recall is computed on the same chunks."""

    client: openai.OpenAI
    http: httpx.Client
    chunk_tokens: int
    overlap_tokens: int
    store_id: str = ""
    local_of: dict[str, str] = field(default_factory=dict)  # the stack's file id -> the corpus' file id
    upload_s: list[float] = field(default_factory=list)
    attach_s: list[float] = field(default_factory=list)

    @classmethod
    def connect(cls, url: str, api_key: str, chunk_tokens: int, overlap_tokens: int) -> StackSide:
        base = url.rstrip("/") + "/v1"
        client = openai.OpenAI(base_url=base, api_key=api_key, max_retries=0, timeout=600)
        http = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {api_key}"}, timeout=600)
        side = cls(client, http, chunk_tokens, overlap_tokens)
        side.store_id = client.vector_stores.create(name="sealed-bench-retrieval").id
        return side

    def add_file(self, file_id: str, text: str, attributes: dict[str, Scalar]) -> float:
        """Upload and attach one file; the seconds both took (the stack's ingestion of it)."""
        t0 = time.perf_counter()
        uploaded = self.client.files.create(file=(f"{file_id}.txt", text.encode()), purpose="assistants")
        t1 = time.perf_counter()
        attached = self.client.vector_stores.files.create(
            vector_store_id=self.store_id, file_id=uploaded.id, attributes=attributes,
            chunking_strategy={"type": "static", "static": {"max_chunk_size_tokens": self.chunk_tokens,
                                                            "chunk_overlap_tokens": self.overlap_tokens}})
        t2 = time.perf_counter()
        if attached.status != "completed":
            raise StackSideError(f"{file_id} was not ingested: {attached.status} {attached.last_error}")
        self.local_of[uploaded.id] = file_id
        self.upload_s.append(t1 - t0)
        self.attach_s.append(t2 - t1)
        return t2 - t0

    def search(self, query: str, k: int) -> tuple[float, list[tuple[str, str]]]:
        """The seconds one search took and its hits as (the corpus' file id, passage text)."""
        t0 = time.perf_counter()
        page = self.client.vector_stores.search(vector_store_id=self.store_id, query=query, max_num_results=k)
        seconds = time.perf_counter() - t0
        hits = [(self.local_of.get(hit.file_id, hit.file_id), "".join(c.text for c in hit.content))
                for hit in page.data]
        return seconds, hits

    def search_http(self, query: str, k: int) -> tuple[float, list[tuple[str, str]]]:
        """As `search`, the same request as bare HTTP: what the stack adds, without the SDK's client side."""
        t0 = time.perf_counter()
        reply = self.http.post(f"vector_stores/{self.store_id}/search", json={"query": query, "max_num_results": k})
        page = reply.json()
        seconds = time.perf_counter() - t0
        if reply.status_code != 200:
            raise StackSideError(f"search answered {reply.status_code}")
        hits = [(self.local_of.get(hit["file_id"], hit["file_id"]), "".join(c["text"] for c in hit["content"]))
                for hit in page["data"]]
        return seconds, hits

    def usage_bytes(self) -> int:
        """The store's `usage_bytes`: its files' text bytes, as the gateway counts them."""
        return self.client.vector_stores.retrieve(self.store_id).usage_bytes

    def close(self) -> None:
        """Delete the store and its files (the stack keeps only what other tenants' runs put there)."""
        self.client.vector_stores.delete(self.store_id)
        for stack_id in self.local_of:
            self.client.files.delete(stack_id)
        self.client.close()
        self.http.close()
