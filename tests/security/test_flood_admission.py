"""#13 acceptance (flood load test): a tenant flooding with maximal requests is refused by its own
limits; those refusals must cost the gateway little. A py-spy profile of the flood benchmark showed
half of the gateway's loop answering the flooder's 429s (each body read, parsed and validated, each
refusal one signed audit write).

Now a key over its own request rate or queue bound is refused before its body is read (the ASGI
app is called with a `receive` that records whether the body was asked for), with the same 429,
charging nothing; and a tenant's admission refusals are audited in aggregate, every one counted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from api.app import build_gateway, create_app
from api.gateway.errors import GatewayError
from api.gateway.settings import GatewaySettings
from policy.audit import read_entries
from policy.limiter import TokenBucketLimiter

BODY = json.dumps({"model": "m", "prompt": ["flood"] * 16, "n": 4, "max_tokens": 64}).encode()


async def _post(app: Any, path: str, secret: str, body: bytes = BODY) -> tuple[int, dict[str, str], dict, bool]:
    """One POST straight into the ASGI app; returns status, headers, JSON body and whether the
    app asked for the request body."""
    asked, sent = [False], []

    async def receive() -> dict[str, Any]:
        asked[0] = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"gw"), (b"authorization", f"Bearer {secret}".encode()),
                         (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
             "client": ("10.1.2.3", 5555), "server": ("gw", 80)}
    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    payload = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, json.loads(payload), asked[0]


def _gateway(tmp_path: Path, **tenant: Any) -> tuple[Any, Any, str, Any]:
    (tmp_path / "gw").mkdir()
    service = build_gateway(GatewaySettings(data_dir=tmp_path / "gw", dev=True))
    app = create_app(service.settings, service)
    service.store.ensure_tenant("flood", **tenant)
    secret, _ = service.store.create_key("flood", "k")
    key = service.catalog.authenticate(secret)  # what a first, admitted request does: the key is now known
    return app, service, secret, key


async def test_a_key_over_its_rate_is_refused_before_its_body_is_read(tmp_path: Path) -> None:
    app, service, secret, key = _gateway(tmp_path, rpm=2)
    limiter, bucket = service.admission.limiter, TokenBucketLimiter.per_minute(2)
    # Under its rate: the request goes on (its body is read; no worker serves "m": 404) and the gate
    # charged nothing (model resolution refuses before admission charges).
    status, _, _, asked = await _post(app, "/v1/completions", secret)
    assert (status, asked) == (404, True)
    assert limiter.available("rpm:t:flood", bucket) >= 1.99
    service.admissions.ticket(key, 0)
    service.admissions.ticket(key, 0)  # the tenant's two requests of this minute
    for path in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/v1/sealed/completions"):
        service.catalog.authenticate(secret)  # known within the last second, also on a slow machine
        status, headers, body, asked = await _post(app, path, secret)
        assert status == 429 and not asked, (path, status, body)
        assert body["error"]["code"] == "rate_limit_exceeded" and body["error"]["type"] == "rate_limit_error"
        assert int(headers["retry-after"]) == 31  # what check_limits answers for 2 requests/minute
    # The same refusal the route gives after reading the body.
    try:
        service.admissions.ticket(key, 0)
    except GatewayError as exc:
        assert exc.status == 429 and exc.headers == {"Retry-After": "31"} and exc.code == "rate_limit_exceeded"
    else:
        raise AssertionError("the bucket is empty: ticket() must refuse")
    # A key not authenticated recently, or none at all, is left to the usual path (a 401 there).
    status, _, _, asked = await _post(app, "/v1/completions", "sk-unknown")
    assert (status, asked) == (401, True)
    service.edge_audit.flush()
    service.admissions.refusals.flush()
    service.audit.close()
    rows = [r for r in read_entries(tmp_path / "audit") if r.action.startswith("admission")]
    assert sum(1 if r.action == "admission" else r.metadata["count"] for r in rows) == 5  # 4 early + 1 ticket
    assert {(r.metadata["limit"], r.metadata["status"]) for r in rows} == {("rate", 429)}


async def test_a_tenant_over_its_queue_bound_is_refused_before_its_body_is_read(tmp_path: Path) -> None:
    app, service, secret, _ = _gateway(tmp_path, max_queued=1)
    counter = service.admission.counter
    assert counter.enter("flood", 1)  # one request of the tenant queued or running: the bound
    service.catalog.authenticate(secret)
    status, headers, body, asked = await _post(app, "/v1/completions", secret)
    assert status == 429 and not asked
    assert body["error"]["code"] == "queue_full" and int(headers["retry-after"]) >= 1
    counter.leave("flood")
    service.catalog.authenticate(secret)
    status, _, _, asked = await _post(app, "/v1/completions", secret)
    assert (status, asked) == (404, True)  # room again: read on (and the gate took no queue place)
    assert counter.enter("flood", 1)
    service.audit.close()


async def test_a_tenants_429_flood_is_aggregated_and_every_refusal_counted(tmp_path: Path) -> None:
    app, service, secret, key = _gateway(tmp_path, rpm=1)
    service.admissions.ticket(key, 0)
    refused = 0
    for _ in range(150):  # refused in the route (after the body)...
        try:
            service.admissions.ticket(key, 0)
        except GatewayError:
            refused += 1
    for _ in range(150):  # ...and before it: one kind, one window
        service.catalog.authenticate(secret)
        refused += (await _post(app, "/v1/completions", secret))[0] == 429
    assert refused == 300
    service.admission.counter.enter("flood", 100)  # and one refusal of another kind (the queue bound)
    queue_full = service.admission.own_limit_refusal("flood", key.key_id, None, None, 1)
    assert queue_full is not None and queue_full.code == "queue_full"
    service.admissions.audit_refusal(key, "queue", queue_full)
    service.admissions.refusals.flush()  # the window closes (or the gateway stops)
    service.audit.close()
    rows = [r for r in read_entries(tmp_path / "audit") if r.action.startswith("admission")]
    assert [r.action for r in rows] == ["admission", "admission", "admission-summary"]  # not 301 entries
    assert rows[0].metadata["limit"] == "rate" and rows[1].metadata["limit"] == "queue"
    assert rows[2].metadata["limit"] == "rate" and rows[2].metadata["count"] == 299
    assert rows[2].metadata["key_id"] == key.key_id and rows[2].tenant == "flood"
