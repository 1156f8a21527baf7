"""#13 finding 9: what an anonymous caller learns. /.well-known/attestation, /readyz and /metrics named
every tenant and model without authentication, and /docs and /openapi.json were public."""

from __future__ import annotations

import datetime as dt
import secrets
from pathlib import Path

import jwt

from api.management.auth import AUDIENCE
from tests.api.fake_worker import FakeServicer
from tests.security.harness import JWT_SECRET, REGISTER_TOKEN, gateway, heartbeat_doc


def _jwt(role: str, tenant: str | None = None) -> dict[str, str]:
    now = dt.datetime.now(dt.UTC)
    token = jwt.encode({"sub": "x", "role": role, "tenant": tenant, "aud": AUDIENCE, "iat": now,
                        "exp": now + dt.timedelta(minutes=5), "jti": secrets.token_hex(16)}, JWT_SECRET,
                       algorithm="HS256")
    return {"Authorization": f"Bearer {token}"}


async def test_anonymous_callers_learn_no_tenant_or_model(tmp_path: Path) -> None:
    async with gateway(tmp_path, [lambda s: FakeServicer(s, 0.001)], tenant="acme", model="secret-model") as gw:
        for path in ("/.well-known/attestation", "/metrics"):
            r = await gw.client.get(path)
            assert r.status_code == 401, (path, r.text)
        r = await gw.client.get("/readyz")
        assert r.status_code == 200 and r.json() == {"ready": True}
        for path in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"):
            assert (await gw.client.get(path)).status_code == 404, path
        # Operators still get the details, and metrics, with a management token.
        detail = await gw.client.get("/admin/v1/readiness", headers=_jwt("operator"))
        assert "acme/secret-model/v1" in detail.json()["models"]
        assert (await gw.client.get("/metrics", headers=_jwt("operator"))).status_code == 200
        assert (await gw.client.get("/metrics", headers=_jwt("tenant-admin", "acme"))).status_code == 403


async def test_attestation_lists_only_the_callers_tenants_workers(tmp_path: Path) -> None:
    async with gateway(tmp_path, [lambda s: FakeServicer(s, 0.001)], tenant="acme", model="m") as gw:
        from pathlib import Path as P

        from enclave_worker.settings import WorkerSettings
        from enclave_worker.state import LiveState, WorkerState

        globex = WorkerState(WorkerSettings(broker_url="", package_dir=P("."), tenant="globex", model="globex-private",
                                            version="v1", host="127.0.0.1", port=9), live=LiveState(status="ready"))
        r = await gw.client.post("/internal/workers/heartbeat", json=heartbeat_doc(globex),
                                 headers={"Authorization": f"Bearer {REGISTER_TOKEN}"})
        assert r.status_code == 200, r.text
        doc = (await gw.client.get("/.well-known/attestation", headers=gw.headers())).json()
        assert [w["tenant"] for w in doc["workers"]] == ["acme"]
        assert "globex" not in str(doc)
        models = (await gw.client.get("/v1/models", headers=gw.headers())).json()["data"]
        assert [m["id"] for m in models] == ["m"]
