"""The Responses API's `file_search` tool in plaintext mode (docs/retrieval.md "file_search").

The chat model's worker holds neither the encoder nor the store's key, so the gateway, which sees a
plaintext prompt anyway, runs the search on the store's encoder worker: the same call, with the same
identity, as `POST /v1/vector_stores/{id}/search` (GatewayRetrieval.search: the worker enforces the
tenant's per-file rights for this caller, and each search is audited with its file ids). The
passages go into the chat request as a system message before the input (protocol/openai/file_search.py).
"""

from __future__ import annotations

from api.gateway.vector_stores import GatewayRetrieval, not_found
from api.store.repo import KeyRecord
from protocol.openai.file_search import RESULTS_INCLUDE, FileSearchTool, Grounding


async def search(retrieval: GatewayRetrieval, key: KeyRecord, tool: FileSearchTool, query: str,
                 include: list[str] | None) -> Grounding:
    """The passages of the tool's stores for `query`, best first, at most max_num_results in all.
    Every store id is checked before any search (404 for an unknown or another tenant's alike)."""
    for store_id in tool.vector_store_ids:
        if retrieval.rows.store(key.tenant, store_id) is None:
            raise not_found("vector store", store_id, param=f"{tool.param}.vector_store_ids")
    results = []
    for store_id in tool.vector_store_ids:
        results += await retrieval.search(key, store_id, query, tool.max_num_results, tool.filters,
                                          tool.score_threshold, rewrite_query=False)
    results.sort(key=lambda r: -float(r["score"]))
    return Grounding(query, results[:tool.max_num_results], with_results=RESULTS_INCLUDE in (include or []))
