"""#13 finding 9: management inputs. A package manifest's names never become paths outside the store;
management token claims are typed strictly (tenant null or a list is refused, never "all tenants" or a 500)."""

from __future__ import annotations

import datetime as dt
import secrets
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi import Header, HTTPException
from fastapi.testclient import TestClient

from api.cli.upload import UploadFailed, upload_package
from api.management.auth import AUDIENCE
from enclave_worker.package.writer import write_package
from tests.api.signed_usage import signed_row
from tests.security.harness import JWT_SECRET, gateway


def _auth(authorization: str = Header("")) -> str:
    if not authorization.startswith("Bearer tenant-"):
        raise HTTPException(401, "bad key")
    return authorization.removeprefix("Bearer tenant-")


@pytest.mark.parametrize("model,version", [("../../x", "v1"), ("m", "../../../v"), ("..", "v1"), ("a/b", "v1"),
                                           (".hidden", "v1")])
def test_manifest_names_never_become_paths_outside_the_store(upload_app, tmp_path: Path, model: str,  # type: ignore[no-untyped-def]
                                                             version: str) -> None:
    import torch

    pkg = tmp_path / "pkg"
    write_package(pkg, metadata={"config": {}, "tokenizer_json": "{}"}, tensors=[("a", torch.zeros(4))],
                  data_key=b"k" * 32, key_id="dek", tenant="t1", model=model, version=version,
                  signing_key=Ed25519PrivateKey.generate(), segment_size=4096)
    store = tmp_path / "deep" / "er" / "store"
    app = upload_app(store, _auth)
    with pytest.raises(UploadFailed, match="422"):
        upload_package(pkg, TestClient(app, headers={"authorization": "Bearer tenant-t1"}))
    written = {p for p in tmp_path.rglob("*") if p.is_file() and not p.is_relative_to(pkg)}
    assert all(p.is_relative_to(store) for p in written), written
    assert not (store / "refs").exists() and not (store / "packages").exists()


def _token(claims: dict) -> str:
    now = dt.datetime.now(dt.UTC)
    return jwt.encode({"sub": "x", "aud": AUDIENCE, "iat": now, "exp": now + dt.timedelta(minutes=5),
                       "jti": secrets.token_hex(16), **claims},
                      JWT_SECRET, algorithm="HS256")


@pytest.mark.parametrize("claims", [
    {"role": "tenant-admin", "tenant": None},
    {"role": "tenant-admin"},
    {"role": "tenant-user", "tenant": ["acme", "other"]},
    {"role": "tenant-admin", "tenant": {"$ne": ""}},
    {"role": "tenant-admin", "tenant": 7},
    {"role": "tenant-admin", "tenant": ""},
    {"role": ["operator"]},
    {"role": "operator", "sub": 12},
])
async def test_mistyped_claims_are_refused(tmp_path: Path, claims: dict) -> None:
    async with gateway(tmp_path, []) as gw:
        for tenant in ("acme", "other"):
            gw.service.store.record_usage(signed_row(gw.service.store,
                request_id=f"r-{tenant}", tenant=tenant, key_id="k", model="m", version="v1", worker_id="w",
                prompt_tokens=1, completion_tokens=1, worker_seconds=0.1))
        for path in ("/admin/v1/usage", "/admin/v1/tenants/acme/keys", "/admin/v1/workers"):
            r = await gw.client.get(path, headers={"Authorization": f"Bearer {_token(claims)}"})
            assert r.status_code in (401, 403), (path, r.status_code, r.text)


async def test_a_tenant_admin_sees_only_its_own_usage(tmp_path: Path) -> None:
    async with gateway(tmp_path, []) as gw:
        for tenant in ("acme", "other"):
            gw.service.store.record_usage(signed_row(gw.service.store,
                request_id=f"r-{tenant}", tenant=tenant, key_id="k", model="m", version="v1", worker_id="w",
                prompt_tokens=1, completion_tokens=1, worker_seconds=0.1))
        admin = _token({"role": "tenant-admin", "tenant": "acme"})
        r = await gw.client.get("/admin/v1/usage?tenant=other", headers={"Authorization": f"Bearer {admin}"})
        assert r.status_code == 200
        assert {row["tenant"] for row in r.json()["data"]} == {"acme"}
