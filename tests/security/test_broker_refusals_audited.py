"""Finding 5 (#13): every refusal at the key broker's edge is audited, attacker-controlled metadata
cannot make the audit write fail, and bad input never gets a 500.

The red team sent `evidence.tee` = 300 x "x" (or a value containing "-----BEGIN"): the audit layer
refused the metadata, the broker answered 500, and nothing was logged.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from attestation.bundle import RuntimeData
from protocol.broker.sealing import raw_public_key
from tests.key_broker.conftest import Clock, Harness

HOSTILE_STRINGS = ["x" * 300, "-----BEGIN PRIVATE KEY-----", "a\nb\r\n{\"seq\":0}", "\u202e\u0000\ud7ff",
                   "é" * 5000, "", " ", "../../etc/passwd", "%s%n{0}", "x" * 70_000]


@pytest.fixture(scope="module")
def kb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    # One broker for the whole table (building a tenant's package is the slow part).
    harness = Harness(tmp_path_factory.mktemp("kb"), Clock(), rate_limit_per_minute=1_000_000)
    harness.setup_tenant("acme")
    yield harness
    harness.close()


def _evidence(kb: Harness, **override: Any) -> tuple[dict[str, Any], str]:
    ch = kb.client.post("/v1/challenge").json()
    runtime = RuntimeData(bytes.fromhex(ch["nonce"]), raw_public_key(X25519PrivateKey.generate()))
    evidence = kb.bundle(runtime).to_json()
    evidence.update(override)
    return evidence, ch["session_id"]


def _entries(kb: Harness) -> list[dict[str, Any]]:
    return kb.audit_entries()


@pytest.mark.parametrize("tee", [*HOSTILE_STRINGS[:4], "x" * 70_000])
def test_hostile_tee_is_refused_audited_and_bounded(kb: Harness, tee: str) -> None:
    before = len(_entries(kb))
    evidence, session = _evidence(kb, tee=tee)
    r = kb.client.post("/v1/attest", json={"session_id": session, "evidence": evidence, "tenant": "acme",
                                           "model": "m", "version": "v1"})
    assert r.status_code in (400, 403), r.text
    after = _entries(kb)
    assert len(after) == before + 1, "the refusal was not audited"
    entry = after[-1]
    assert entry["decision"] == "deny" and entry["action"] == "attest"
    line = json.dumps(entry)
    assert "-----BEGIN" not in line and "x" * 257 not in line and "\n" not in line
    assert all(len(str(v)) <= 256 for v in entry["metadata"].values())


def _fields() -> list[tuple[str, str, Any]]:
    """(route, field, hostile value): every field of every worker route, with values of wrong type,
    size and shape."""
    values: list[Any] = [*HOSTILE_STRINGS, None, 0, -1, 2**70, 1.5e308, True, [], {}, ["x"], {"a": "b"}]
    rows = []
    for route, fields in (("/v1/attest", ("session_id", "tenant", "model", "version", "evidence")),
                          ("/v1/key", ("token", "tenant", "model", "version")),
                          ("/v1/key/status", ("token", "tenant", "model", "version"))):
        rows += [(route, f, v) for f in fields for v in values]
    rows += [("/v1/attest", f"evidence.{k}", v)
             for k in ("tee", "cpu_evidence", "cpu_certificates", "runtime_data", "gpus") for v in values]
    return rows


@pytest.mark.parametrize(("route", "field", "value"), _fields(),
                         ids=lambda x: repr(x)[:24] if not isinstance(x, str) else x[:24])
def test_worker_routes_never_answer_500(kb: Harness, route: str, field: str, value: Any) -> None:
    evidence, session = _evidence(kb)
    body: dict[str, Any] = {"tenant": "acme", "model": "m", "version": "v1"}
    if route == "/v1/attest":
        body.update(session_id=session, evidence=evidence)
    else:
        body["token"] = "e30.e30.e30"
    if field.startswith("evidence."):
        body["evidence"] = {**evidence, field.split(".", 1)[1]: value}
    else:
        body[field] = value
    before = len(_entries(kb))
    r = kb.client.post(route, json=body)
    assert r.status_code < 500, (r.status_code, r.text)
    if r.status_code in (400, 403):  # a refusal past schema validation: audited, bounded
        assert len(_entries(kb)) == before + 1


def test_raw_bodies_never_answer_500(kb: Harness) -> None:
    for route in ("/v1/challenge", "/v1/attest", "/v1/key", "/v1/key/status"):
        for raw in (b"", b"{", b"[]", b"null", b"\xff\xfe", b'{"evidence": ' + b"[" * 5000 + b"]" * 5000 + b"}",
                    b'{"tenant": "\\ud800"}', json.dumps({"x": "y" * 100_000}).encode()):
            r = kb.client.post(route, content=raw, headers={"content-type": "application/json"})
            assert r.status_code < 500, (route, raw[:20], r.status_code)


def _admin_rows() -> list[tuple[str, str, Any]]:
    """(method, path, body) of the admin API with hostile paths and bodies."""
    values: list[Any] = [*HOSTILE_STRINGS[:9], None, 0, 2**70, 1.5e308, True, [], {}, ["x"], {"a": "b"}]
    policy = {"policy_id": "p", "version": 2, "tenant": "acme", "model": "m", "allowed_tee": ["sim"]}
    rows: list[tuple[str, str, Any]] = []
    for field in ("policy_id", "version", "tenant", "model", "model_version", "allowed_tee", "allowed_measurements",
                  "min_tcb", "allow_debug", "reference_values", "unknown_field"):
        rows += [("PUT", "/tenants/acme/policies", {**policy, field: v}) for v in values]
    rows += [("PUT", "/tenants/acme/policies", v) for v in values]
    rows += [("PUT", "/tenants/acme/reference-values", v) for v in values]
    rows += [("PUT", "/tenants/acme/reference-values", {"payload": v, "key_id": "k", "alg": "Ed25519", "sig": "00"})
             for v in values]
    rows += [("PUT", "/tenants/acme/models/m/versions/v9/data-key",
              {"sealed_key": {"a": "b"}, "manifest": v if isinstance(v, str) else "", "signature_files": {}})
             for v in values]
    rows += [("PUT", "/tenants/acme/reference-value-keys/k1", {"public_key_pem": v}) for v in values]
    for name in ("x" * 300, "..", "a%2F..%2Fb", "-----BEGIN", "ACME", "a b"):
        rows += [("POST", f"/tenants/{name}/key", None), ("GET", f"/tenants/{name}", None),
                 ("POST", f"/tenants/{name}/key/rotate", None), ("GET", f"/tenants/{name}/receipts", None)]
    return rows


@pytest.mark.parametrize(("method", "path", "body"), _admin_rows(),
                         ids=lambda x: repr(x)[:24] if not isinstance(x, str) else x[:24])
def test_admin_routes_never_answer_500(kb: Harness, method: str, path: str, body: Any) -> None:
    r = kb.admin(method, path, json=body) if body is not None else kb.admin(method, path)
    assert r.status_code < 500, (r.status_code, r.text)
    assert "-----BEGIN" not in r.text and "x" * 257 not in r.text


def test_schema_refusals_are_audited_in_aggregate(tmp_path: Path) -> None:
    """The broker's schema errors (FastAPI's 422) are refusals too: audited like the gateway's edge
    refusals (the first of each kind per 60 s in full, the rest counted in a summary), without the
    values sent; the caller's answer is unchanged."""
    canary = "CANARY-5b1e-never-logged"
    harness = Harness(tmp_path / "kb", Clock(), rate_limit_per_minute=1_000_000)
    try:
        for _ in range(40):
            r = harness.client.post("/v1/key", json={"token": 5, "tenant": canary, "model": "m", "version": "v1"})
            assert r.status_code == 422 and r.json()["error"]["type"] == "invalid_request", r.text
            assert canary not in r.text
        assert harness.client.post("/v1/attest", json={"session_id": canary}).status_code == 422
        early = [e["action"] for e in harness.audit_entries() if e["action"].startswith("edge-refusal")]
        assert early == ["edge-refusal", "edge-refusal"]  # one per kind while the window is open
    finally:
        harness.close()  # the broker stops: the window's summaries are written
    rows = [e for e in harness.audit_entries() if e["action"].startswith("edge-refusal")]
    assert [(e["action"], e["metadata"]["route"], e["metadata"]["status"]) for e in rows] == [
        ("edge-refusal", "/v1/key", 422), ("edge-refusal", "/v1/attest", 422),
        ("edge-refusal-summary", "/v1/key", 422)]
    assert rows[2]["metadata"]["count"] == 39 and all(e["tenant"] == "-" and e["decision"] == "deny" for e in rows)
    assert canary not in (harness.settings.data_dir.parent / "audit" / "key-broker.audit.jsonl").read_text()


def test_other_edge_refusals_are_audited_in_aggregate(tmp_path: Path) -> None:
    """The same for the broker's other answers at the edge: an unknown admin token (401), an unknown
    route (404), a wrong method (405), a body over the limit (413); the answers are unchanged."""
    canary = "CANARY-9d2f-never-logged"
    harness = Harness(tmp_path / "kb", Clock(), rate_limit_per_minute=1_000_000, max_body_bytes=4096)
    try:
        for _ in range(5):
            r = harness.admin("GET", "/tenants/acme", token=canary)
            assert r.status_code == 401 and r.json() == {"detail": {"type": "unauthorized",
                                                                     "message": "missing or invalid admin token"}}
        assert harness.client.get("/v1/nope").status_code == 404
        assert harness.client.get("/v1/key").status_code == 405
        assert harness.client.post("/v1/key", content=b"x" * 5000,
                                   headers={"content-type": "application/json"}).status_code == 413
    finally:
        harness.close()
    rows = [e for e in harness.audit_entries() if e["action"].startswith("edge-refusal")]
    got = [(e["action"], e["metadata"]["status"], e["metadata"].get("count")) for e in rows]
    assert got == [("edge-refusal", 401, None), ("edge-refusal", 404, None), ("edge-refusal", 405, None),
                   ("edge-refusal", 413, None), ("edge-refusal-summary", 401, 4)]
    assert rows[0]["metadata"]["route"] == "/v1/admin/tenants/{tenant}"  # the template, not the path
    assert canary not in (harness.settings.data_dir.parent / "audit" / "key-broker.audit.jsonl").read_text()
