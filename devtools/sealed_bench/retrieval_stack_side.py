"""The stack's side of `sealed bench retrieval --stack-url`: the same files uploaded, attached to a
vector store and searched through a running stack's HTTP API with the official openai SDK, so the
figures include everything the boundary adds (the gateway, gRPC, the worker's sealing of each file,
the store snapshot the worker reseals whole on every ingest and the gateway reads back and stores,
and on every search the gateway's row read and the store named to the worker, which holds it open)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import openai

from enclave_worker.retrieval.filters import Scalar


class StackSideError(RuntimeError):
    """The stack refused or failed a step of the benchmark (the message says which)."""


@dataclass
class StackSide:
    """One vector store on the stack, filled file by file; ``keys`` maps a passage the stack returns
    (its file id and text) to the plain side's chunk keys, so recall is computed on the same chunks."""

    client: openai.OpenAI
    chunk_tokens: int
    overlap_tokens: int
    store_id: str = ""
    local_of: dict[str, str] = field(default_factory=dict)  # the stack's file id -> the corpus' file id
    upload_s: list[float] = field(default_factory=list)
    attach_s: list[float] = field(default_factory=list)

    @classmethod
    def connect(cls, url: str, api_key: str, chunk_tokens: int, overlap_tokens: int) -> StackSide:
        client = openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key=api_key, max_retries=0, timeout=600)
        side = cls(client, chunk_tokens, overlap_tokens)
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

    def usage_bytes(self) -> int:
        """The store's `usage_bytes`: its files' text bytes, as the gateway counts them."""
        return self.client.vector_stores.retrieve(self.store_id).usage_bytes

    def close(self) -> None:
        """Delete the store and its files (the stack keeps only what other tenants' runs put there)."""
        self.client.vector_stores.delete(self.store_id)
        for stack_id in self.local_of:
            self.client.files.delete(stack_id)
        self.client.close()
