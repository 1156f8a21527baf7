"""Package upload for the management API: chunked, resumable, stored content-addressed.

The control plane is outside the trust boundary: it receives ciphertext and public metadata only,
and checks what it can without a key (sizes, SHA-256 of each file, the manifest's format and
signature, that the manifest's tenant is the caller). Workers re-check everything themselves.

    binder.bind(package_store, PackageStore(store_dir))  # where uploads and packages go (api/parts.py)
    binder.include(router)                              # a plain router, as the gateway serves it

The caller is a tenant admin (`uploader`, the management API's role check); an app without the
management API replaces `uploader` (`binder.replace`) with its own dependency returning the
caller's tenant (a `str`, or an object with a `.tenant` attribute). Routes, all under /v1/packages:

    POST /uploads                      {"files": {name: {"size", "sha256"}}} -> upload_id, offsets
                                       (files: manifest.json, payload.bin and either manifest.sig
                                       or model.sig + signer.pub.pem)
    GET  /uploads/{upload_id}          current offsets (resume)
    PUT  /uploads/{upload_id}/{name}?offset=N   raw bytes (header x-sealed-chunk-sha256: their SHA-256);
                                       200 + {"offset"} once stored whole; 409 + {"offset"} if N is
                                       not the end; a cut, oversized or tampered chunk is dropped
    POST /uploads/{upload_id}/complete verify, then store at packages/<address>/; 201 + record
    GET  /{address}                    the stored package's public record

The upload id is derived from the tenant and the declared files, so re-declaring the same
package resumes it, from any client, without client-side state. Memory stays flat: a chunk streams
to disk as it arrives (the body is never held whole), and completion hashes the files in pieces.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Header, HTTPException, Request
from pydantic import BaseModel, Field
from starlette.requests import ClientDisconnect

from api.management.auth import require
from protocol.package import PackageError, read_manifest
from protocol.package.format import UPLOAD_CHUNK_DIGEST_HEADER as CHUNK_DIGEST_HEADER  # optional on a PUT

# A package: manifest + payload + the files of one signature method (Ed25519, or model-signing).
FILE_SETS = (
    frozenset({"manifest.json", "payload.bin", "manifest.sig"}),
    frozenset({"manifest.json", "payload.bin", "model.sig", "signer.pub.pem"}),
)
PACKAGE_FILES = tuple(sorted(frozenset().union(*FILE_SETS)))
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
# Names that become one path component each (refs/<tenant>/<model>/<version>.json): no separators,
# no "." or "..", nothing hidden. The manifest is the uploader's: checked before any path is built.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,127}$")


def path_component(value: str, what: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value) or ".." in value:
        raise HTTPException(422, f"the package's {what} is not a valid name (letters, digits, '.', '_', '-')")
    return value
_MAX_META_FILE = 64 << 20  # manifest.json and manifest.sig are small; bound them


class FileDecl(BaseModel):
    size: int = Field(ge=0, le=1 << 40)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class UploadDecl(BaseModel):
    files: dict[str, FileDecl]


def _tenant_of(principal: Any) -> str:
    tenant = principal if isinstance(principal, str) else getattr(principal, "tenant", None)
    if not isinstance(tenant, str) or not tenant:
        raise HTTPException(401, "no tenant for this caller")
    return tenant


def package_address(files: dict[str, FileDecl]) -> str:
    """Content address: SHA-256 over the canonical list of (name, size, sha256) of the package files."""
    doc = {name: [decl.size, decl.sha256] for name, decl in files.items()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass
class PackageStore:
    """uploads/ (staging), packages/<address>/ and refs/<tenant>/<model>/<version>.json under `root`."""

    root: Path
    max_chunk_bytes: int = 64 << 20
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    @property
    def staging(self) -> Path:
        return Path(self.root) / "uploads"

    @property
    def packages(self) -> Path:
        return Path(self.root) / "packages"

    @property
    def refs(self) -> Path:
        return Path(self.root) / "refs"

    def upload_dir(self, tenant: str, upload_id: str) -> Path:
        if not _HEX64.match(upload_id):
            raise HTTPException(404, "no such upload")
        path = self.staging / upload_id
        try:
            decl = json.loads((path / "upload.json").read_text())
        except (OSError, ValueError):
            raise HTTPException(404, "no such upload") from None
        if decl["tenant"] != tenant:
            raise HTTPException(404, "no such upload")  # same answer as absent: no probing
        return path


def declared(path: Path) -> dict[str, FileDecl]:
    return {k: FileDecl(**v) for k, v in json.loads((path / "upload.json").read_text())["files"].items()}


def offsets(path: Path) -> dict[str, int]:
    return {name: (path / name).stat().st_size if (path / name).exists() else 0 for name in declared(path)}


uploader = require("tenant-admin")  # the caller; an app without the management API overrides it


def caller_tenant(principal: Any = Depends(uploader)) -> str:
    return _tenant_of(principal)


async def package_store() -> PackageStore:
    """Where uploads and packages go: `create_app` binds the app's in this one's place (api/parts.py; a
    typed dependency, never a service locator on the app); an app that binds none serves no uploads."""
    raise HTTPException(404, "package uploads are not enabled here")


router = APIRouter(prefix="/v1/packages", tags=["packages"])


@router.post("/uploads", status_code=201)
def declare(decl: UploadDecl, tenant: str = Depends(caller_tenant),
            store: PackageStore = Depends(package_store)) -> dict[str, Any]:
    if frozenset(decl.files) not in FILE_SETS:
        raise HTTPException(422, "a package is manifest.json, payload.bin and one method's signature files")
    if max(v.size for k, v in decl.files.items() if k != "payload.bin") > _MAX_META_FILE:
        raise HTTPException(413, "manifest too large")
    files = {k: v.model_dump() for k, v in sorted(decl.files.items())}
    upload_id = hashlib.sha256(json.dumps({"tenant": tenant, "files": files}, sort_keys=True).encode()).hexdigest()
    path = store.staging / upload_id
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not (path / "upload.json").exists():
        (path / "upload.json").write_text(json.dumps({"tenant": tenant, "files": files}))
    return {"upload_id": upload_id, "offsets": offsets(path), "max_chunk_bytes": store.max_chunk_bytes}


@router.get("/uploads/{upload_id}")
def status(upload_id: str, tenant: str = Depends(caller_tenant),
           store: PackageStore = Depends(package_store)) -> dict[str, Any]:
    return {"upload_id": upload_id, "offsets": offsets(store.upload_dir(tenant, upload_id))}


@router.put("/uploads/{upload_id}/{name}")
async def put_chunk(upload_id: str, name: str, offset: int, request: Request, tenant: str = Depends(caller_tenant),
                    store: PackageStore = Depends(package_store),
                    chunk_sha256: str | None = Header(None, alias=CHUNK_DIGEST_HEADER)) -> dict[str, Any]:
    """Append one chunk at `offset`; acknowledged (200 + the new end) only once all of it is stored.
    A chunk cut short (the connection dropped), too large, or unlike its declared SHA-256 is removed
    again: the file ends at the last acknowledged chunk, which is where the client resumes."""
    path = store.upload_dir(tenant, upload_id)
    files = declared(path)
    if name not in files:
        raise HTTPException(404, "not a declared file of this upload")
    if chunk_sha256 is not None and not _HEX64.match(chunk_sha256):
        raise HTTPException(422, f"{CHUNK_DIGEST_HEADER} is not a lowercase hex SHA-256")
    size = files[name].size
    async with store.locks.setdefault(upload_id, asyncio.Lock()):
        current = offsets(path)[name]
        if offset != current:
            raise HTTPException(409, {"message": "offset is not the end of the file", "offset": current})
        written = 0
        digest = hashlib.sha256()
        with open(path / name, "ab") as fh:
            try:
                async for chunk in request.stream():
                    written += len(chunk)
                    if written > store.max_chunk_bytes or current + written > size:
                        raise HTTPException(413, "chunk too large or past the declared size")
                    fh.write(chunk)
                    digest.update(chunk)
                if chunk_sha256 is not None and digest.hexdigest() != chunk_sha256:
                    raise HTTPException(422, "the chunk differs from its SHA-256; send it again")
            except BaseException as exc:  # cut connection, refusal, cancellation: nothing of it is kept
                fh.truncate(current)
                if isinstance(exc, ClientDisconnect):  # expected on a flaky link: an answer, not a traceback
                    raise HTTPException(400, {"message": "the chunk was cut short", "offset": current}) from None
                raise
    return {"offset": current + written}


@router.post("/uploads/{upload_id}/complete", status_code=201)
def complete(upload_id: str, tenant: str = Depends(caller_tenant),
             store: PackageStore = Depends(package_store)) -> dict[str, Any]:
    path = store.upload_dir(tenant, upload_id)
    files = declared(path)
    for name, decl in files.items():
        if not (path / name).exists() or (path / name).stat().st_size != decl.size:
            raise HTTPException(409, {"message": f"{name} is incomplete", "offsets": offsets(path)})
        if _file_sha256(path / name) != decl.sha256:
            (path / name).unlink()
            raise HTTPException(422, f"{name} differs from its declared SHA-256; upload it again")
    try:
        manifest, _, signer = read_manifest(path)
    except PackageError as exc:
        raise HTTPException(422, f"not a valid package: {exc}") from exc
    if manifest.tenant != tenant:
        raise HTTPException(403, "the package is for another tenant")
    model, version = path_component(manifest.model, "model"), path_component(manifest.version, "version")
    if files["payload.bin"].size != manifest.payload_bytes:
        raise HTTPException(422, "payload size differs from the manifest")
    address = package_address(files)
    record = {"address": address, "tenant": tenant, "model": manifest.model, "version": manifest.version,
              "package_id": manifest.package_id, "signer": signer, "key_id": manifest.key_id,
              "plaintext_digest": manifest.plaintext_digest, "payload_bytes": manifest.payload_bytes,
              "kind": manifest.kind}  # chat | embedding: signed in the manifest, checked again by the worker
    ref = store.refs / path_component(tenant, "tenant") / model / f"{version}.json"
    if ref.exists() and json.loads(ref.read_text())["address"] != address:
        raise HTTPException(409, "this model version already has another package; versions are immutable")
    target = store.packages / address
    if not target.exists():
        store.packages.mkdir(parents=True, exist_ok=True)
        tmp = store.packages / f".{address}.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(mode=0o700)
        for name in files:
            os.replace(path / name, tmp / name)
        (tmp / "record.json").write_text(json.dumps(record, sort_keys=True))
        os.replace(tmp, target)
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(json.dumps({"address": address}))
    shutil.rmtree(path, ignore_errors=True)
    store.locks.pop(upload_id, None)
    return record


@router.get("/{address}")
def get_package(address: str, tenant: str = Depends(caller_tenant),
                store: PackageStore = Depends(package_store)) -> dict[str, Any]:
    if not _HEX64.match(address) or not (store.packages / address / "record.json").exists():
        raise HTTPException(404, "no such package")
    record: dict[str, Any] = json.loads((store.packages / address / "record.json").read_text())
    if record["tenant"] != tenant:
        raise HTTPException(404, "no such package")
    return record


def stored_package_dir(store_dir: Path, tenant: str, model: str, version: str) -> Path:
    """Where a released model version's package lies (for a worker's --package-dir)."""
    ref = (Path(store_dir) / "refs" / path_component(tenant, "tenant") / path_component(model, "model")
           / f"{path_component(version, 'version')}.json")
    address: str = json.loads(ref.read_text())["address"]
    return Path(store_dir) / "packages" / address
