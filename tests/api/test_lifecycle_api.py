"""Management routes for the version lifecycle and the control loop, and /readyz per version."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from api.gateway.settings import GatewaySettings, WorkerRoute
from api.management.auth import issue_token
from policy.documents import sign_policy_document
from tests.api.gateway_client import GatewayClient

SECRET = "j" * 40


@pytest.fixture()
def gw(tmp_path: Path) -> GatewayClient:
    settings = GatewaySettings(data_dir=tmp_path, dev=True, jwt_secret=SECRET, register_token="r" * 40,
                               workers=(WorkerRoute("demo", "m", "v1"),))
    return GatewayClient(settings)


def auth(role: str = "operator", tenant: str | None = None) -> dict[str, str]:
    return {"Authorization": f"Bearer {issue_token(SECRET, 'test', role, tenant)}"}


def detail(gw: GatewayClient) -> dict:
    """/readyz says only ready or not; the per-version detail is for operators."""
    return gw.get("/admin/v1/readiness", headers=auth()).json()


def beat(gw: GatewayClient, tenant: str, model: str, version: str, status: str, reason: str = "",
         wid: str = "w1") -> None:
    gw.service.registry.heartbeat({
        "worker_id": wid, "grpc_address": f"127.0.0.1:{abs(hash(wid)) % 50000 + 1000}", "http_url": "http://x",
        "tenant": tenant, "model": model, "version": version, "status": status, "tee": "sim", "insecure": True,
        "usage_public_key": "00" * 32, "reason": reason})


def test_one_failing_version_leaves_the_gateway_ready_and_readyz_says_which_and_why(gw: GatewayClient) -> None:
    assert gw.get("/readyz").status_code == 503  # the only version has no worker yet
    beat(gw, "demo", "m", "v1", "ready")
    assert gw.post("/admin/v1/tenants/acme/models", json={"model": "bad", "version": "v1"},
                   headers=auth()).status_code == 201
    beat(gw, "acme", "bad", "v1", "failed", "key release refused by the key broker", wid="w2")
    r = gw.get("/readyz")
    assert r.status_code == 200 and r.json() == {"ready": True}
    doc = detail(gw)
    assert doc["models"]["demo/m/v1"]["state"] == "ready"
    assert doc["models"]["acme/bad/v1"]["state"] == "failing"
    assert doc["failing"] == {"acme/bad/v1": "key release refused by the key broker"}


def test_readyz_is_unready_only_when_nothing_can_serve(gw: GatewayClient) -> None:
    beat(gw, "demo", "m", "v1", "failed", "package rejected (PackageIntegrityError)")
    assert gw.get("/readyz").status_code == 503
    assert detail(gw)["failing"]["demo/m/v1"] == "package rejected (PackageIntegrityError)"
    # A version allowed to scale to zero needs no warm worker: it is "cold", not a reason to be unready.
    gw.post("/admin/v1/tenants/demo/models", json={"model": "m", "version": "v1", "min_warm": 0}, headers=auth())
    gw.service.registry.workers.clear()
    doc = detail(gw)
    assert doc["models"]["demo/m/v1"]["state"] == "cold" and doc["ready"] is True
    assert gw.get("/readyz").status_code == 200


def test_the_control_loop_status_shows_in_readyz_and_bad_values_are_refused(gw: GatewayClient) -> None:
    beat(gw, "demo", "m", "v1", "ready")
    gw.post("/admin/v1/tenants/acme/models", json={"model": "x", "version": "v1"}, headers=auth())
    url = "/admin/v1/deployments/acme/x/v1/status"
    assert gw.put(url, json={"status": "waiting", "reason": "no data key at the key broker"},
                  headers=auth()).status_code == 200
    assert detail(gw)["models"]["acme/x/v1"] == {
        "warm": 0, "min_warm": 1, "max_replicas": 1, "state": "waiting", "reason": "no data key at the key broker"}
    for body in ({"status": "exploded"}, {"status": "waiting", "reason": "x" * 300}, {"status": 1}):
        assert gw.put(url, json=body, headers=auth()).status_code == 400  # the gateway's validation error
    assert gw.put(url, json={"status": "waiting"}, headers=auth("tenant-admin", "acme")).status_code == 403
    assert gw.put("/admin/v1/deployments/acme/nope/v1/status", json={"status": "waiting"},
                  headers=auth()).status_code == 404


def test_retire_moves_traffic_hides_the_version_and_rollback_restores(gw: GatewayClient) -> None:
    h = auth("tenant-admin", "acme")
    gw.post("/admin/v1/tenants/acme/models", json={"model": "x", "version": "v1"}, headers=h)
    gw.post("/admin/v1/tenants/acme/models", json={"model": "x", "version": "v2"}, headers=h)
    gw.post("/admin/v1/tenants/acme/models/x/rollout", json={"version": "v2", "percent": 40}, headers=h)
    r = gw.post("/admin/v1/tenants/acme/models/x/versions/v2/retire", headers=h)
    assert r.status_code == 200
    assert {v["version"]: (v["traffic_percent"], v["retired"]) for v in r.json()["data"]} == {
        "v1": (100.0, False), "v2": (0.0, True)}
    assert "acme/x/v2" not in detail(gw)["models"]
    assert gw.post("/admin/v1/tenants/acme/models/x/rollout", json={"version": "v2", "percent": 50},
                   headers=h).status_code == 409
    assert gw.post("/admin/v1/tenants/acme/models/x/versions/v9/retire", headers=h).status_code == 404
    assert gw.post("/admin/v1/tenants/other/models/x/versions/v1/retire", headers=h).status_code == 404
    rows = gw.post("/admin/v1/tenants/acme/models/x/rollback", headers=h).json()["data"]
    assert {v["version"]: v["traffic_percent"] for v in rows} == {"v1": 60.0, "v2": 40.0}


def test_version_bounds_are_checked(gw: GatewayClient) -> None:
    for body in ({"model": "x", "version": "v1", "min_warm": 3, "max_replicas": 2},
                 {"model": "x/../y", "version": "v1"}, {"model": "x..y", "version": "v1"},
                 {"model": "x", "version": "v..1"}, {"model": "x", "version": "v1", "min_warm": -1},
                 {"model": "x", "version": "v1", "ttft_slo_ms": 0}):
        assert gw.post("/admin/v1/tenants/acme/models", json=body, headers=auth()).status_code == 400, body
    assert gw.get("/admin/v1/tenants/acme/models", headers=auth()).json()["data"] == []


def test_names_that_form_no_model_ref_are_refused_at_the_route_and_change_nothing(gw: GatewayClient) -> None:
    h = auth()
    assert gw.post("/admin/v1/tenants/a..b/models", json={"model": "x", "version": "v1"}, headers=h).status_code == 400
    assert gw.service.store.tenant("a..b") is None
    assert gw.post("/admin/v1/tenants/acme/models", json={"model": "x", "version": "v1"}, headers=h).status_code == 201
    assert gw.post("/admin/v1/tenants/acme/models/x..y/versions/v1/retire", headers=h).status_code == 404
    assert gw.post("/admin/v1/tenants/acme/models/x/rollout", json={"version": "v..1", "percent": 50},
                   headers=h).status_code == 404
    assert gw.put("/admin/v1/deployments/acme/x/v..1/status", json={"status": "failing"},
                  headers=h).status_code == 404
    rows = gw.get("/admin/v1/tenants/acme/models", headers=h).json()["data"]
    assert [(r["version"], r["traffic_percent"], r["retired"]) for r in rows] == [("v1", 100.0, False)]


def test_tokens_are_minted_by_operators_only_and_work(gw: GatewayClient) -> None:
    gw.post("/admin/v1/tenants", json={"name": "acme"}, headers=auth())
    body = {"role": "tenant-admin", "tenant": "acme", "subject": "alice", "ttl_s": 600}
    assert gw.post("/admin/v1/tokens", json=body, headers=auth("tenant-admin", "acme")).status_code == 403
    assert gw.post("/admin/v1/tokens", json={**body, "tenant": None}, headers=auth()).status_code == 400
    assert gw.post("/admin/v1/tokens", json={**body, "tenant": "ghost"}, headers=auth()).status_code == 404
    assert gw.post("/admin/v1/tokens", json={**body, "ttl_s": 10**9}, headers=auth()).status_code == 400
    assert gw.post("/admin/v1/tokens", json={**body, "role": "root"}, headers=auth()).status_code == 400
    token = gw.post("/admin/v1/tokens", json=body, headers=auth()).json()["token"]
    who = gw.get("/admin/v1/whoami", headers={"Authorization": f"Bearer {token}"}).json()
    assert who == {"subject": "alice", "role": "tenant-admin", "tenant": "acme"}


def test_deployments_show_bounds_package_and_load_to_operators_only(gw: GatewayClient, tmp_path: Path) -> None:
    gw.post("/admin/v1/tenants/acme/models", json={"model": "x", "version": "v1", "min_warm": 0,
                                                   "max_replicas": 3, "ttft_slo_ms": 500}, headers=auth())
    ref = tmp_path / "package-store" / "refs" / "acme" / "x" / "v1.json"
    ref.parent.mkdir(parents=True)
    ref.write_text(json.dumps({"address": "ab" * 32}))
    assert gw.get("/admin/v1/deployments", headers=auth("tenant-admin", "acme")).status_code == 403
    rows = {f"{d['tenant']}/{d['model']}/{d['version']}": d
            for d in gw.get("/admin/v1/deployments", headers=auth("auditor")).json()["data"]}
    row = rows["acme/x/v1"]
    assert (row["min_warm"], row["max_replicas"], row["ttft_slo_ms"], row["package"]) == (0, 3, 500, "ab" * 32)
    assert row["load"] == {"queue_depth": 0, "unserved_recent": 0, "ttft_ms": None}
    assert rows["demo/m/v1"]["package"] is None


def test_a_request_for_a_cold_model_is_a_retryable_503_and_counts_as_demand(gw: GatewayClient) -> None:
    secret, _ = gw.service.store.create_key("acme", "k")
    gw.post("/admin/v1/tenants/acme/models", json={"model": "x", "version": "v1", "min_warm": 0}, headers=auth())
    r = gw.post("/v1/chat/completions", headers={"Authorization": f"Bearer {secret}"},
                json={"model": "x", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 503 and r.headers["retry-after"] and r.json()["error"]["code"] == "model_unavailable"
    row = next(d for d in gw.get("/admin/v1/deployments", headers=auth()).json()["data"] if d["model"] == "x")
    assert row["load"]["unserved_recent"] == 1
    metrics = gw.get("/metrics", headers=auth("auditor")).text
    assert 'sealed:model_unserved_requests{model_name="x",tenant="acme"} 1.0' in metrics


def _signed_policy(tenant: str) -> tuple[dict, str, Ed25519PrivateKey]:
    key = Ed25519PrivateKey.generate()
    doc = sign_policy_document({"policy_id": "p", "version": 1, "tenant": tenant, "data": {}}, key, "admin-1")
    pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                        serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return doc, pem, key


def test_a_policy_with_its_admin_key_is_checked_before_it_is_stored(gw: GatewayClient) -> None:
    doc, pem, _ = _signed_policy("acme")
    _, other_pem, _ = _signed_policy("acme")
    h = auth("tenant-admin", "acme")
    for bad in ({"document": doc, "admin_key_pem": other_pem},  # signed by another key
                {"document": {**doc, "sig": "00" * 64}, "admin_key_pem": pem},
                {"document": doc, "admin_key_pem": "not a key"}):
        assert gw.put("/admin/v1/tenants/acme/policy", json=bad, headers=h).status_code == 422
    assert gw.get("/admin/v1/tenants/acme/policy", headers=h).status_code == 404  # nothing stored
    assert gw.put("/admin/v1/tenants/acme/policy", json={"document": doc, "admin_key_pem": pem},
                  headers=h).status_code == 200
    stored = gw.get("/admin/v1/tenants/acme/policy", headers=h).json()
    assert stored["document"] == doc and stored["admin_key_pem"] == pem
