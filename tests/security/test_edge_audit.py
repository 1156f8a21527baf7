"""#13 audit gaps: answers made at the edge (401, 403, 404, 405, 413, schema errors: FastAPI's 422, answered
400 in OpenAI's shape) at the gateway
and the management API are audited, without content, and a flood of them cannot fill the disk
(aggregated per kind and window, every refusal counted: policy/audit/edge.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient

from api.app import build_gateway, create_app
from api.cli.audit import load_component_keys
from api.gateway.service import GatewayService
from api.gateway.settings import GatewaySettings
from api.management.auth import issue_token
from policy.audit import AuditLog, read_entries, verify_dir
from policy.audit.edge import EdgeRefusals

JWT_SECRET = "x" * 40
CANARY = "CANARY-7f3a9c-do-not-log"


def _gateway(tmp_path: Path) -> GatewayService:
    (tmp_path / "gw").mkdir()
    return build_gateway(GatewaySettings(data_dir=tmp_path / "gw", dev=True, jwt_secret=JWT_SECRET,
                                         max_body_bytes=4096))


def test_edge_refusals_are_audited_with_reason_and_without_content(tmp_path: Path) -> None:
    service = _gateway(tmp_path)
    app = create_app(service.settings, service)
    service.store.ensure_tenant("acme")
    api_key, _ = service.store.create_key("acme", "k")
    bad_key = f"sk-{CANARY}"
    user = issue_token(JWT_SECRET, "bob", "tenant-user", "acme")
    with TestClient(app) as c:
        h = {"Authorization": f"Bearer {api_key}"}
        answers = [
            c.post("/v1/completions", json={"model": "m", "prompt": CANARY},
                   headers={"Authorization": f"Bearer {bad_key}"}),
            c.get("/v1/models"),  # no key at all
            c.post("/v1/completions", json={"model": f"m-{CANARY}", "prompt": CANARY}, headers=h),  # 404 model
            c.post("/v1/completions", json={"prompt": CANARY, "max_tokens": "x"}, headers=h),  # schema
            c.post("/v1/completions", content=b"{" + CANARY.encode(),
                   headers={**h, "content-type": "application/json"}),
            c.get(f"/v1/{CANARY}", headers=h),  # no such route
            c.post("/v1/completions", content=b'{"prompt": "' + b"a" * 8192 + b'"}', headers=h),  # body limit
            c.get("/admin/v1/tenants", headers={"Authorization": f"Bearer {CANARY}"}),  # management 401
            c.post("/admin/v1/tenants", json={"name": "zz"}, headers={"Authorization": f"Bearer {user}"}),  # 403
            c.post("/admin/v1/tenants/acme/keys", json={"name": CANARY, "rpm": "many"},
                   headers={"Authorization": f"Bearer {issue_token(JWT_SECRET, 'ops', 'operator')}"}),  # 422
        ]
        assert [a.status_code for a in answers] == [401, 401, 404, 400, 400, 404, 413, 401, 403, 400], [
            (a.status_code, a.text) for a in answers]
    audit_dir = tmp_path / "audit"
    rows = [r for r in read_entries(audit_dir) if r.action == "edge-refusal"]
    got = {(r.metadata["status"], r.metadata["code"], r.metadata["route"], r.tenant) for r in rows}
    assert got == {
        (401, "invalid_api_key", "/v1/completions", "-"),
        (401, "invalid_api_key", "/v1/models", "-"),
        (404, "model_not_found", "/v1/completions", "acme"),
        (400, "invalid_value", "/v1/completions", "acme"),  # schema errors (FastAPI's 422)
        (400, "invalid_json", "/v1/completions", "-"),  # refused before the key is read
        (404, "not_found", f"unmatched:/v1/{CANARY}", "-"),
        (413, "body_too_large", "unmatched:/v1/completions", "-"),
        (401, "invalid_token", "/admin/v1/tenants", "-"),
        (403, "forbidden", "/admin/v1/tenants", "acme"),
        (400, "invalid_value", "/admin/v1/tenants/{tenant}/keys", "-"),
    }
    assert all(r.decision == "deny" and r.reason.startswith(str(r.metadata["status"])) for r in rows)
    wrong = next(r for r in rows if r.metadata["route"] == "/v1/completions" and r.metadata["status"] == 401)
    assert wrong.metadata["key_fp"] == hashlib.sha256(bad_key.encode()).hexdigest()[:12]
    # No content reached the trail: not the prompt, not the presented secret, not the body.
    raw = "".join(p.read_text() for p in audit_dir.glob("*.jsonl"))
    assert bad_key not in raw and api_key not in raw
    assert raw.count(CANARY) == 1  # only the unknown route's path (bounded), never a body or a secret
    assert verify_dir(audit_dir, load_component_keys(audit_dir / "keys"))  # signed, chained, complete


def test_a_401_flood_is_aggregated_and_every_refusal_counted(tmp_path: Path) -> None:
    service = _gateway(tmp_path)
    with TestClient(create_app(service.settings, service)) as c:
        for i in range(300):
            assert c.get("/v1/models", headers={"Authorization": f"Bearer sk-guess-{i}"}).status_code == 401
    rows = read_entries(tmp_path / "audit")
    full = [r for r in rows if r.action == "edge-refusal"]
    summaries = [r for r in rows if r.action == "edge-refusal-summary"]
    assert len(full) == 1 and len(summaries) == 1  # 300 refusals, two entries
    assert 1 + summaries[0].metadata["count"] == 300


def test_kinds_are_bounded_and_windows_roll(tmp_path: Path) -> None:
    now = [0.0]
    with AuditLog(tmp_path / "g.audit.jsonl", Ed25519PrivateKey.generate(), "gateway") as audit:
        edge = EdgeRefusals(audit, window_s=60, max_kinds=4, clock=lambda: now[0])
        for i in range(10):  # ten sources: four kinds in full, the rest counted in one overflow summary
            edge.refused({"client": (f"10.0.0.{i}", 1), "method": "GET", "path": "/v1/models"}, 401,
                         "invalid_api_key")
        edge.refused({"client": ("10.0.0.0", 1), "method": "GET", "path": "/v1/models"}, 401, "invalid_api_key")
        now[0] = 61.0  # the next refusal closes the window
        edge.refused({"client": ("10.0.0.0", 1), "method": "GET", "path": "/v1/models"}, 401, "invalid_api_key")
        edge.refused({"method": "POST", "path": "/v1/x"}, 429, "rate_limit_exceeded")  # audited at admission
        edge.flush()
    rows = read_entries(tmp_path / "g.audit.jsonl")
    assert [r.action for r in rows] == ["edge-refusal"] * 4 + ["edge-refusal-summary"] * 2 + ["edge-refusal"]
    assert rows[4].metadata["count"] == 1 and rows[5].metadata["overflow"] is True and rows[5].metadata["count"] == 6
