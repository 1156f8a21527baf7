"""Uploads over a real connection (uvicorn on localhost, behind a TCP proxy that cuts or alters the
stream): a chunk is stored whole or not at all, the client resumes from the last acknowledged chunk,
an altered chunk is refused and sent again, and another tenant cannot touch the upload."""

from __future__ import annotations

import hashlib
import secrets
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
import uvicorn
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi import FastAPI, Header, HTTPException

from api.cli.upload import describe, upload_package
from api.management.uploads import stored_package_dir
from api.stack import free_port
from enclave_worker.package import decrypt_package
from enclave_worker.package.writer import write_package
from protocol.package.format import UPLOAD_CHUNK_DIGEST_HEADER
from sealed_bench.cutting_proxy import CuttingProxy
from tests.policy.audit.stream.chaos import wait_until

CHUNK = 128 << 10


def _auth(authorization: str = Header("")) -> str:
    if not authorization.startswith("Bearer tenant-"):
        raise HTTPException(401, "bad key")
    return authorization.removeprefix("Bearer tenant-")


@pytest.fixture()
def server(upload_app, tmp_path: Path) -> Iterator[tuple[int, Path]]:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    app: FastAPI = upload_app(store, _auth)
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    wait_until(lambda: srv.started, "uvicorn listening")  # a hang guard only: no duration is asserted
    yield port, store
    srv.should_exit = True
    thread.join(10)


def _package(root: Path) -> tuple[Path, bytes, dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    tensors = {f"layer{i}.weight": torch.randn(256, 256, generator=gen) for i in range(8)}  # 2 MiB
    key = secrets.token_bytes(32)
    write_package(root, metadata={"config": {}}, tensors=list(tensors.items()), data_key=key, key_id="dek-t",
                  tenant="t1", model="m", version="v1", signing_key=Ed25519PrivateKey.generate(),
                  segment_size=64 << 10)
    return root, key, tensors


def _client(port: int, tenant: str = "t1") -> httpx.Client:
    return httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"authorization": f"Bearer tenant-{tenant}"},
                        timeout=30.0)


def test_upload_with_the_connection_cut_twice_completes(server: tuple[int, Path], tmp_path: Path) -> None:
    port, store = server
    pkg, key, tensors = _package(tmp_path / "pkg")
    total = sum(f["size"] for f in describe(pkg).values())
    proxy = CuttingProxy(port, cut_at=[total // 3, 2 * total // 3])
    sent: list[int] = []
    with _client(proxy.port) as client:
        record = upload_package(pkg, client, chunk_bytes=CHUNK, progress=sent.append, sleep=lambda s: None)
    proxy.close()
    assert proxy.cuts == 2
    assert sum(sent) == total  # every byte acknowledged once: resumed, not restarted
    model = decrypt_package(stored_package_dir(store, "t1", "m", "v1"), key)
    assert record["address"] and all(torch.equal(model.tensors[n], t) for n, t in tensors.items())


def test_a_chunk_altered_in_transit_is_refused_and_sent_again(server: tuple[int, Path], tmp_path: Path) -> None:
    port, store = server
    pkg, key, _ = _package(tmp_path / "pkg")
    proxy = CuttingProxy(port, cut_at=[], flip_at=[(1 << 20) + 12345])
    with _client(proxy.port) as client:
        upload_package(pkg, client, chunk_bytes=CHUNK, sleep=lambda s: None)
    proxy.close()
    assert proxy.flips == 1
    decrypt_package(stored_package_dir(store, "t1", "m", "v1"), key)  # what is stored is what was sent


def _declare(client: httpx.Client, pkg: Path) -> str:
    upload_id: str = client.post("/v1/packages/uploads", json={"files": describe(pkg)}).json()["upload_id"]
    return upload_id


def test_a_chunk_cut_short_is_not_kept(server: tuple[int, Path], tmp_path: Path) -> None:
    """The server writes a chunk as it arrives; when the connection drops mid-chunk, the file goes back
    to its last acknowledged end, so the next chunk at that offset is accepted (not a 409)."""
    port, store = server
    pkg, _, _ = _package(tmp_path / "pkg")
    payload = (pkg / "payload.bin").read_bytes()
    with _client(port) as client:
        upload_id = _declare(client, pkg)
        raw = socket.create_connection(("127.0.0.1", port))
        raw.sendall((f"PUT /v1/packages/uploads/{upload_id}/payload.bin?offset=0 HTTP/1.1\r\nhost: x\r\n"
                     f"authorization: Bearer tenant-t1\r\ncontent-length: {CHUNK}\r\n\r\n").encode()
                    + payload[:5000])
        staged = store / "uploads" / upload_id / "payload.bin"
        # the server holds the partial chunk
        wait_until(lambda: staged.exists() and staged.stat().st_size >= 5000, "the partial chunk staged")
        raw.close()
        whole = client.put(f"/v1/packages/uploads/{upload_id}/payload.bin", params={"offset": 0},
                           content=payload[:CHUNK])
        assert whole.status_code == 200 and whole.json() == {"offset": CHUNK}


def test_tampered_missing_and_foreign_chunks_are_refused(server: tuple[int, Path], tmp_path: Path) -> None:
    port, store = server
    pkg, _, _ = _package(tmp_path / "pkg")
    payload = (pkg / "payload.bin").read_bytes()
    with _client(port) as client:
        upload_id = _declare(client, pkg)
        url = f"/v1/packages/uploads/{upload_id}/payload.bin"
        good = hashlib.sha256(payload[:CHUNK]).hexdigest()
        altered = client.put(url, params={"offset": 0}, content=b"\xff" + payload[1:CHUNK],
                             headers={UPLOAD_CHUNK_DIGEST_HEADER: good})
        assert altered.status_code == 422 and "differs from its SHA-256" in altered.text
        malformed = client.put(url, params={"offset": 0}, content=payload[:CHUNK],
                               headers={UPLOAD_CHUNK_DIGEST_HEADER: "XYZ"})
        assert malformed.status_code == 422
        assert client.get(f"/v1/packages/uploads/{upload_id}").json()["offsets"]["payload.bin"] == 0
        assert client.put(url, params={"offset": 0}, content=payload[:CHUNK],
                          headers={UPLOAD_CHUNK_DIGEST_HEADER: good}).status_code == 200
        skipped = client.put(url, params={"offset": 2 * CHUNK}, content=payload[2 * CHUNK : 3 * CHUNK])
        assert skipped.status_code == 409 and skipped.json()["detail"]["offset"] == CHUNK  # a gap is refused
        incomplete = client.post(f"/v1/packages/uploads/{upload_id}/complete")
        assert incomplete.status_code == 409  # a missing segment: nothing is stored
        with _client(port, tenant="t2") as other:  # another tenant resuming t1's upload: as if absent
            assert other.get(f"/v1/packages/uploads/{upload_id}").status_code == 404
            assert other.put(url, params={"offset": CHUNK}, content=payload[CHUNK : 2 * CHUNK]).status_code == 404
            assert other.post(f"/v1/packages/uploads/{upload_id}/complete").status_code == 404
        assert client.get(f"/v1/packages/uploads/{upload_id}").json()["offsets"]["payload.bin"] == CHUNK
    assert not (store / "packages").exists()
