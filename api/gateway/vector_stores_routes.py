"""/v1/vector_stores, their files, file batches and search (OpenAI's Vector Stores API):
api/gateway/vector_stores.py. Ingestion runs while the request waits, so a file is `completed` or
`failed` (with OpenAI's last_error) when its create call answers; pollers see it at once."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from api.gateway.dependencies import current_key, get_service
from api.gateway.errors import GatewayError
from api.gateway.files_routes import get_retrieval, list_page
from api.gateway.service import GatewayService
from api.gateway.vector_stores import MAX_FILES_PER_CALL, GatewayRetrieval, new_id
from api.store.repo import KeyRecord
from api.store.retrieval import StoredVectorStore, StoreFile

router = APIRouter()


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


Metadata = dict[Annotated[str, StringConstraints(min_length=1, max_length=64)],
               Annotated[str, StringConstraints(max_length=512)]]  # OpenAI's limits


class CreateStore(_Body):
    name: str | None = Field(default=None, max_length=256)
    file_ids: list[str] = Field(default_factory=list, max_length=MAX_FILES_PER_CALL)
    metadata: Metadata = Field(default_factory=dict, max_length=16)
    chunking_strategy: dict[str, Any] | None = None
    expires_after: None = None  # stores do not expire here
    description: str | None = Field(default=None, max_length=512)


class AttachFile(_Body):
    file_id: str = Field(max_length=64)
    attributes: dict[str, Any] | None = None
    chunking_strategy: dict[str, Any] | None = None


class CreateBatch(_Body):
    file_ids: list[str] = Field(min_length=1, max_length=MAX_FILES_PER_CALL)
    attributes: dict[str, Any] | None = None
    chunking_strategy: dict[str, Any] | None = None


class RankingOptions(_Body):
    ranker: Literal["auto", "default-2024-11-15", "none"] | None = None
    score_threshold: float | None = None


class Search(_Body):
    query: str | list[str]
    max_num_results: int = Field(default=10, ge=1, le=50)
    filters: dict[str, Any] | None = None
    ranking_options: RankingOptions | None = None
    rewrite_query: bool = False


def _counts(files: list[StoreFile]) -> dict[str, int]:
    done = sum(f.status == "completed" for f in files)
    failed = sum(f.status == "failed" for f in files)
    return {"in_progress": 0, "completed": done, "failed": failed, "cancelled": 0, "total": len(files)}


def store_object(retrieval: GatewayRetrieval, s: StoredVectorStore) -> dict[str, Any]:
    created = int(s.created_at.timestamp())
    return {"id": s.id, "object": "vector_store", "created_at": created, "name": s.name,
            "usage_bytes": s.usage_bytes, "file_counts": _counts(retrieval.rows.store_files(s.tenant, s.id)),
            "status": "completed", "expires_after": None, "expires_at": None, "last_active_at": created,
            "metadata": s.metadata}


def store_file_object(f: StoreFile) -> dict[str, Any]:
    error = {"code": f.error_code, "message": f.error_message} if f.status == "failed" else None
    return {"id": f.file_id, "object": "vector_store.file", "created_at": int(f.created_at.timestamp()),
            "usage_bytes": f.usage_bytes, "vector_store_id": f.store_id, "status": f.status, "last_error": error,
            "chunking_strategy": f.chunking or None, "attributes": f.attributes}


@router.post("/v1/vector_stores")
async def create_store(body: CreateStore, key: KeyRecord = Depends(current_key),
                       service: GatewayService = Depends(get_service),
                       retrieval: GatewayRetrieval = Depends(get_retrieval)) -> dict[str, Any]:
    service.admissions.ticket(key, 0)
    for file_id in body.file_ids:  # every file must be the caller's before the store exists
        retrieval.file(key, file_id)
    store = retrieval.create_store(key, body.name, body.metadata)
    for file_id in body.file_ids:
        await retrieval.attach(key, store.id, file_id, None, body.chunking_strategy)
    return store_object(retrieval, retrieval.store(key, store.id))


@router.get("/v1/vector_stores")
def list_stores(after: str | None = None, limit: int = Query(default=20, ge=1, le=100),
                order: Literal["asc", "desc"] = "desc", key: KeyRecord = Depends(current_key),
                service: GatewayService = Depends(get_service),
                retrieval: GatewayRetrieval = Depends(get_retrieval)) -> dict[str, Any]:
    service.admissions.ticket(key, 0)
    stores = [store_object(retrieval, s) for s in retrieval.rows.stores(key.tenant)]
    return list_page(stores, order=order, after=after, limit=limit)


@router.get("/v1/vector_stores/{store_id}")
def retrieve_store(store_id: str, key: KeyRecord = Depends(current_key), service: GatewayService = Depends(get_service),
                   retrieval: GatewayRetrieval = Depends(get_retrieval)) -> dict[str, Any]:
    service.admissions.ticket(key, 0)
    return store_object(retrieval, retrieval.store(key, store_id))


@router.delete("/v1/vector_stores/{store_id}")
def delete_store(store_id: str, key: KeyRecord = Depends(current_key), service: GatewayService = Depends(get_service),
                 retrieval: GatewayRetrieval = Depends(get_retrieval)) -> dict[str, Any]:
    service.admissions.ticket(key, 0)
    retrieval.delete_store(key, store_id)
    return {"id": store_id, "object": "vector_store.deleted", "deleted": True}


@router.post("/v1/vector_stores/{store_id}/files")
async def attach_file(store_id: str, body: AttachFile, key: KeyRecord = Depends(current_key),
                      service: GatewayService = Depends(get_service),
                      retrieval: GatewayRetrieval = Depends(get_retrieval)) -> dict[str, Any]:
    service.admissions.ticket(key, 0)
    return store_file_object(await retrieval.attach(key, store_id, body.file_id, body.attributes,
                                                    body.chunking_strategy))


@router.get("/v1/vector_stores/{store_id}/files")
def list_store_files(store_id: str, after: str | None = None, limit: int = Query(default=20, ge=1, le=100),
                     order: Literal["asc", "desc"] = "desc", filter: Literal["completed", "failed"] | None = None,
                     key: KeyRecord = Depends(current_key), service: GatewayService = Depends(get_service),
                     retrieval: GatewayRetrieval = Depends(get_retrieval)) -> dict[str, Any]:
    service.admissions.ticket(key, 0)
    retrieval.store(key, store_id)
    files = [store_file_object(f) for f in retrieval.rows.store_files(key.tenant, store_id)
             if filter is None or f.status == filter]
    return list_page(files, order=order, after=after, limit=limit)


@router.get("/v1/vector_stores/{store_id}/files/{file_id}")
def retrieve_store_file(store_id: str, file_id: str, key: KeyRecord = Depends(current_key),
                        service: GatewayService = Depends(get_service),
                        retrieval: GatewayRetrieval = Depends(get_retrieval)) -> dict[str, Any]:
    service.admissions.ticket(key, 0)
    return store_file_object(retrieval.store_file(key, store_id, file_id))


@router.delete("/v1/vector_stores/{store_id}/files/{file_id}")
async def detach_file(store_id: str, file_id: str, key: KeyRecord = Depends(current_key),
                      service: GatewayService = Depends(get_service),
                      retrieval: GatewayRetrieval = Depends(get_retrieval)) -> dict[str, Any]:
    service.admissions.ticket(key, 0)
    await retrieval.detach(key, store_id, file_id)
    return {"id": file_id, "object": "vector_store.file.deleted", "deleted": True}


def batch_object(store_id: str, batch_id: str, files: list[StoreFile]) -> dict[str, Any]:
    created = min((int(f.created_at.timestamp()) for f in files), default=0)
    return {"id": batch_id, "object": "vector_store.files_batch", "created_at": created,
            "vector_store_id": store_id, "status": "completed", "file_counts": _counts(files)}


@router.post("/v1/vector_stores/{store_id}/file_batches")
async def create_batch(store_id: str, body: CreateBatch, key: KeyRecord = Depends(current_key),
                       service: GatewayService = Depends(get_service),
                       retrieval: GatewayRetrieval = Depends(get_retrieval)) -> dict[str, Any]:
    service.admissions.ticket(key, 0)
    retrieval.store(key, store_id)
    for file_id in body.file_ids:
        retrieval.file(key, file_id)
    batch_id = new_id("vsfb")
    files = [await retrieval.attach(key, store_id, f, body.attributes, body.chunking_strategy, batch_id)
             for f in dict.fromkeys(body.file_ids)]
    return batch_object(store_id, batch_id, files)


@router.get("/v1/vector_stores/{store_id}/file_batches/{batch_id}")
def retrieve_batch(store_id: str, batch_id: str, key: KeyRecord = Depends(current_key),
                   service: GatewayService = Depends(get_service),
                   retrieval: GatewayRetrieval = Depends(get_retrieval)) -> dict[str, Any]:
    service.admissions.ticket(key, 0)
    retrieval.store(key, store_id)
    files = retrieval.rows.store_files(key.tenant, store_id, batch_id)
    if not files:
        raise GatewayError(404, f"No file batch found with id '{batch_id[:64]}'.", code="not_found")
    return batch_object(store_id, batch_id, files)


@router.post("/v1/vector_stores/{store_id}/search")
async def search(store_id: str, body: Search, key: KeyRecord = Depends(current_key),
                 service: GatewayService = Depends(get_service),
                 retrieval: GatewayRetrieval = Depends(get_retrieval)) -> dict[str, Any]:
    service.admissions.ticket(key, 0)
    queries = [body.query] if isinstance(body.query, str) else body.query
    if len(queries) != 1:
        raise GatewayError(400, "query must be one string (or a list of one)", param="query", code="invalid_value")
    threshold = body.ranking_options.score_threshold if body.ranking_options else None
    data = await retrieval.search(key, store_id, queries[0], body.max_num_results, body.filters, threshold,
                                  body.rewrite_query)
    return {"object": "vector_store.search_results.page", "search_query": queries, "data": data,
            "has_more": False, "next_page": None}
