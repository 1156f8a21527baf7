"""Package upload through the management router: chunked, resumable, content-addressed, key-free."""

from __future__ import annotations

from pathlib import Path
from typing import Any as Pkg  # the fixture type lives in conftest.py

import pytest
import torch
from fastapi import Header, HTTPException
from fastapi.testclient import TestClient

from api.cli.upload import UploadFailed, describe, upload_package
from api.management.uploads import stored_package_dir
from enclave_worker.package import decrypt_package


def _auth(authorization: str = Header("")) -> str:
    if not authorization.startswith("Bearer tenant-"):
        raise HTTPException(401, "bad key")
    return authorization.removeprefix("Bearer tenant-")


@pytest.fixture()
def upload_client(upload_app):  # type: ignore[no-untyped-def]
    def make(store: Path, tenant: str = "t1", **kw: int) -> TestClient:
        return TestClient(upload_app(store, _auth, **kw), headers={"authorization": f"Bearer tenant-{tenant}"})
    return make


def test_upload_round_trip(upload_client, pkg: Pkg, tmp_path: Path) -> None:
    store = tmp_path / "store"
    seen: list[int] = []
    record = upload_package(pkg.path, upload_client(store), chunk_bytes=5000, progress=seen.append)
    assert sum(seen) == sum(f["size"] for f in describe(pkg.path).values())
    assert (record["tenant"], record["model"], record["version"]) == ("t1", "m", "v1")
    stored = stored_package_dir(store, "t1", "m", "v1")
    assert stored.name == record["address"]
    model = decrypt_package(stored, pkg.data_key)
    assert torch.equal(model.tensors["a.weight"], pkg.tensors["a.weight"])
    assert not list((store / "uploads").iterdir())
    # Idempotent: the same package again is the same address.
    assert upload_package(pkg.path, upload_client(store))["address"] == record["address"]


def test_upload_resumes_after_interruption(upload_client, pkg: Pkg, tmp_path: Path) -> None:
    store = tmp_path / "store"
    client = upload_client(store)
    decl = client.post("/v1/packages/uploads", json={"files": describe(pkg.path)}).json()
    payload = (pkg.path / "payload.bin").read_bytes()
    url = f"/v1/packages/uploads/{decl['upload_id']}/payload.bin"
    assert client.put(url, params={"offset": 0}, content=payload[:7000]).status_code == 200
    stale = client.put(url, params={"offset": 0}, content=payload[:100])
    assert stale.status_code == 409
    # A new client process declares the same files and continues from 7000 bytes.
    sent: list[int] = []
    record = upload_package(pkg.path, upload_client(store), chunk_bytes=4096, progress=sent.append)
    assert sum(sent) == sum(f["size"] for f in describe(pkg.path).values()) - 7000
    assert record["address"]


def test_upload_refuses_corruption_other_tenant_and_oversize(upload_client, pkg: Pkg, tmp_path: Path) -> None:
    store = tmp_path / "store"
    files = describe(pkg.path)
    client = upload_client(store, max_chunk_bytes=4096)
    upload_id = client.post("/v1/packages/uploads", json={"files": files}).json()["upload_id"]
    assert client.put(f"/v1/packages/uploads/{upload_id}/payload.bin", params={"offset": 0},
                      content=b"x" * 5000).status_code == 413
    # Another tenant cannot see or complete this upload, nor store a package naming tenant t1.
    other = upload_client(store, tenant="t2")
    assert other.get(f"/v1/packages/uploads/{upload_id}").status_code == 404
    with pytest.raises(UploadFailed, match="403"):
        upload_package(pkg.path, other)
    # Bytes that differ from the declared digest are refused at completion.
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("manifest.json", "manifest.sig", "payload.bin"):
        (bad / name).write_bytes((pkg.path / name).read_bytes())
    data = bytearray((bad / "payload.bin").read_bytes())
    data[3] ^= 1
    upload_id = client.post("/v1/packages/uploads", json={"files": files}).json()["upload_id"]
    for name in ("manifest.json", "manifest.sig", "payload.bin"):
        blob = bytes(data) if name == "payload.bin" else (bad / name).read_bytes()
        for off in range(0, len(blob), 4096):
            assert client.put(f"/v1/packages/uploads/{upload_id}/{name}", params={"offset": off},
                              content=blob[off : off + 4096]).status_code == 200
    assert client.post(f"/v1/packages/uploads/{upload_id}/complete").status_code == 422
    assert not (store / "packages").exists()


def test_upload_needs_auth(upload_app, pkg: Pkg, tmp_path: Path) -> None:
    client = TestClient(upload_app(tmp_path / "store", _auth))
    with pytest.raises(UploadFailed, match="401"):
        upload_package(pkg.path, client)
