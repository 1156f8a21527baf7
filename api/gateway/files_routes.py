"""/v1/files (OpenAI's Files API, purposes `assistants` and `user_data`): api/gateway/vector_stores.py.

The content is parsed in memory, sealed by a worker as it arrives and kept as ciphertext; GET .../content is refused
(400, as OpenAI refuses downloading `assistants` files): a document is opened only inside a worker."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from api.gateway.dependencies import current_key, get_service
from api.gateway.errors import GatewayError
from api.gateway.service import GatewayService
from api.gateway.vector_stores import GatewayRetrieval
from api.store.repo import KeyRecord
from api.store.retrieval import StoredFile

router = APIRouter()


async def get_retrieval() -> GatewayRetrieval:
    """Files and vector stores: `create_app` binds the one it built in this one's place (a typed
    dependency, as the gateway's parts are: dependencies.py, api/parts.py)."""
    raise RuntimeError("no retrieval bound: build the app with api.app.create_app(settings)")


def file_object(f: StoredFile) -> dict[str, Any]:
    return {"id": f.id, "object": "file", "bytes": f.size, "created_at": int(f.created_at.timestamp()),
            "filename": f.filename, "purpose": f.purpose, "status": "processed", "expires_at": None,
            "status_details": None}


def list_page(data: list[dict[str, Any]], *, order: str, after: str | None, limit: int) -> dict[str, Any]:
    """A cursor page, as OpenAI's list endpoints answer."""
    ordered = data[::-1] if order == "desc" else list(data)
    if after is not None:
        ids = [d["id"] for d in ordered]
        if after not in ids:
            raise GatewayError(400, f"no object with id '{after[:64]}' in this list", param="after",
                               code="invalid_value")
        ordered = ordered[ids.index(after) + 1:]
    page = ordered[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(ordered) > limit}


class InMemoryMultiPartParser(MultiPartParser):
    """Starlette's multipart parser, but a file part never rolls over to a temporary file on disk
    (SpooledTemporaryFile with max_size 0 stays in memory): a document never touches the disk. The
    body is bounded before it is read (the edge's max_body_bytes)."""

    spool_max_size = 0


async def _upload(request: Request) -> tuple[str, bytes, str]:
    """(filename, content, purpose) of a multipart upload, parsed in memory."""
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != "multipart/form-data":
        raise GatewayError(400, "upload a file as multipart/form-data with 'file' and 'purpose'", code="invalid_value")
    try:
        form = await InMemoryMultiPartParser(request.headers, request.stream(), max_files=1, max_fields=4).parse()
    except MultiPartException as exc:
        raise GatewayError(400, f"the multipart body does not parse: {exc.message}", code="invalid_value") from None
    upload, purpose = form.get("file"), form.get("purpose")
    if not isinstance(upload, UploadFile) or not isinstance(purpose, str):
        raise GatewayError(400, "a file upload needs 'file' (a file) and 'purpose'", param="file",
                           code="invalid_value")
    try:
        return upload.filename or "file", await upload.read(), purpose
    finally:
        await form.close()


@router.post("/v1/files")
async def create_file(request: Request, key: KeyRecord = Depends(current_key),
                      service: GatewayService = Depends(get_service),
                      retrieval: GatewayRetrieval = Depends(get_retrieval)) -> dict[str, Any]:
    service.admissions.ticket(key, 0)  # requests-per-minute limits apply here too
    filename, content, purpose = await _upload(request)
    return file_object(await retrieval.create_file(key, filename, purpose, content))


@router.get("/v1/files")
def list_files(purpose: str | None = None, after: str | None = None, limit: int = Query(default=100, ge=1, le=10000),
               order: Literal["asc", "desc"] = "desc", key: KeyRecord = Depends(current_key),
               service: GatewayService = Depends(get_service),
               retrieval: GatewayRetrieval = Depends(get_retrieval)) -> dict[str, Any]:
    service.admissions.ticket(key, 0)
    files = [file_object(f) for f in retrieval.rows.files(key.tenant, purpose)]
    return list_page(files, order=order, after=after, limit=limit)


@router.get("/v1/files/{file_id}")
def retrieve_file(file_id: str, key: KeyRecord = Depends(current_key), service: GatewayService = Depends(get_service),
                  retrieval: GatewayRetrieval = Depends(get_retrieval)) -> dict[str, Any]:
    service.admissions.ticket(key, 0)
    return file_object(retrieval.file(key, file_id))


@router.get("/v1/files/{file_id}/content")
def file_content(file_id: str, key: KeyRecord = Depends(current_key), service: GatewayService = Depends(get_service),
                 retrieval: GatewayRetrieval = Depends(get_retrieval)) -> dict[str, Any]:
    service.admissions.ticket(key, 0)
    found = retrieval.file(key, file_id)
    raise GatewayError(400, f"Not allowed to download files of purpose: {found.purpose}. A file's content is "
                            "opened only inside an attested worker.", code="invalid_value")


@router.delete("/v1/files/{file_id}")
def delete_file(file_id: str, key: KeyRecord = Depends(current_key), service: GatewayService = Depends(get_service),
                retrieval: GatewayRetrieval = Depends(get_retrieval)) -> dict[str, Any]:
    service.admissions.ticket(key, 0)
    retrieval.delete_file(key, file_id)
    return {"id": file_id, "object": "file", "deleted": True}
