"""#35: in sealed mode the gateway sees that a request happened, not why or what was decided.

#13 had the worker's in-enclave decisions on a sealed request travel in clear gRPC trailers into the
gateway's audit log (rule names, deny/redact): the tenant's own rules became an oracle on its users'
prompts for the operator. Now every opened sealed request yields one fixed-size record, signed by the
worker and sealed to the tenant's decision-record key; the gateway audits it as an opaque entry, and
only the tenant's audit view (`sealed audit decisions --key ...`) opens it. Real worker servicer,
real gRPC, the real gateway service, the real CLI."""

from __future__ import annotations

import base64
import json
import logging
import re
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from typer.testing import CliRunner

from api.cli.audit import build
from api.gateway.audit import audit_worker_decisions
from policy.audit import AuditLog, read_entries
from policy.audit.worker_record import DECISION_METADATA_KEY, public_key_bytes, sign_decision
from protocol.rpc import worker_pb2
from protocol.sealed.decision_record import RECORD_METADATA_KEY, WIRE_BYTES
from protocol.sealed.http import ResponseHead
from tests.security.sealed_harness import CARD_PROMPT, CLEAN_PROMPT, SSN_PROMPT, Stack, sealed_stack

# What the operator must not learn about these prompts: the rules' names and the outcome classes.
OPAQUE_RUN = re.compile(r"[A-Za-z0-9+/=]{32,}")
SECRETS = ("US_SSN", "CREDIT_CARD", "pii", "redact", "content-input", "deny", "123-45", "4111", "quokka")


def _write_key(key: X25519PrivateKey, path: Path) -> Path:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return path


async def _ask(stack: Stack, content: str, request_id: str) -> int:
    sealed, request = stack.sealed(content, request_id)
    plain = []
    async for chunk in stack.service.sealed_stream(stack.key, "m", request):
        plain += [p for p, _ in sealed.opener.feed(chunk.data)]
    return ResponseHead.decode(plain[0]).status


def _decisions_cli(audit_dir: Path, key: Path, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(build(), ["decisions", "--key", str(key), "--tenant", "acme", "--dir",
                                          str(audit_dir), *extra])
    return result.exit_code, result.output


async def test_ssn_and_card_decisions_reach_the_tenant_and_not_the_gateway(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tenant_key = X25519PrivateKey.generate()
    caplog.set_level(logging.DEBUG)
    async with sealed_stack(tmp_path, tenant_key) as stack:
        statuses = [await _ask(stack, SSN_PROMPT, "rq1"), await _ask(stack, CARD_PROMPT, "rq2"),
                    await _ask(stack, CLEAN_PROMPT, "rq3")]
        # What the gateway's gRPC client sees in trailers, asked directly: no decision, one record of one size.
        trailers = []
        for content, rid in ((SSN_PROMPT, "rq4"), (CARD_PROMPT, "rq5"), (CLEAN_PROMPT, "rq6")):
            call = stack.stub.SealedGenerate(stack.sealed(content, rid)[1])
            [_ async for _ in call]
            trailers.append(list(await call.trailing_metadata()))
    assert statuses == [403, 200, 200]  # enforced in the enclave, as before
    for metadata in trailers:
        assert [k for k, _ in metadata if k == DECISION_METADATA_KEY] == []
        assert [len(v) for k, v in metadata if k == RECORD_METADATA_KEY] == [WIRE_BYTES]

    rows = read_entries(tmp_path / "audit")
    assert [r.action for r in rows] == ["sealed-record"] * 3  # one per request, decisions or not
    assert {(r.decision, r.reason) for r in rows} == {("record", "")}
    assert len({frozenset(r.metadata) for r in rows}) == 1  # the same fields for each
    assert len({len(str(r.metadata["sealed_record"])) for r in rows}) == 1
    raw = "".join(p.read_text() for p in (tmp_path / "audit").glob("*.jsonl"))
    # Ciphertext, hashes and signatures are long base64/hex runs in which a short word such as
    # "pii" or "4111" turns up by chance; what must not leak is readable text, so scan outside them.
    readable = OPAQUE_RUN.sub("<opaque>", raw)
    logged = OPAQUE_RUN.sub("<opaque>", caplog.text)
    for secret in SECRETS:
        assert secret not in readable, secret
        assert secret not in logged, secret

    # The tenant's view opens them: the rule and outcome of each, in the worker's sequence.
    code, out = _decisions_cli(tmp_path / "audit", _write_key(tenant_key, tmp_path / "tenant.pem"), "--json")
    assert code == 0, out
    report = json.loads(out.splitlines()[0])
    by_request = {r["request_id"]: r for r in report["records"]}
    assert [by_request[rid]["seq"] for rid in ("rq1", "rq2", "rq3")] == [1, 2, 3]
    ssn, card = by_request["rq1"]["decisions"], by_request["rq2"]["decisions"]
    assert [(d["action"], d["decision"], d["request_id"]) for d in ssn] == [("content-input", "deny", "rq1-0")]
    assert [(d["action"], d["decision"]) for d in card] == [("content-input", "redact")]
    assert "US_SSN" in ssn[0]["rule"] or "pii" in ssn[0]["rule"]
    assert by_request["rq3"]["decisions"] == []
    assert report["gaps"] == [] and report["invalid"] == []
    code, text = _decisions_cli(tmp_path / "audit", tmp_path / "tenant.pem")
    assert code == 0 and ssn[0]["rule"] in text and "redact" in text

    # Another key opens nothing; a pinned worker key that is not this worker's refuses every record.
    code, out = _decisions_cli(tmp_path / "audit", _write_key(X25519PrivateKey.generate(), tmp_path / "other.pem"))
    assert code == 1 and "INVALID" in out
    code, out = _decisions_cli(tmp_path / "audit", tmp_path / "tenant.pem", "--worker-key", "ab" * 32)
    assert code == 1 and "not pinned" in out


async def test_a_record_the_gateway_drops_is_a_gap_the_tenant_sees(tmp_path: Path) -> None:
    tenant_key = X25519PrivateKey.generate()
    async with sealed_stack(tmp_path, tenant_key) as stack:
        await _ask(stack, CLEAN_PROMPT, "rq1")
        audit = stack.service.settlement.sealed_record
        stack.service.settlement.sealed_record = lambda *a, **k: True  # type: ignore[method-assign]
        await _ask(stack, SSN_PROMPT, "rq2")  # a gateway that drops this one's record
        stack.service.settlement.sealed_record = audit  # type: ignore[method-assign]
        await _ask(stack, CLEAN_PROMPT, "rq3")
    code, out = _decisions_cli(tmp_path / "audit", _write_key(tenant_key, tmp_path / "tenant.pem"))
    assert code == 2 and "GAP" in out and "records 2 missing" in out


async def test_a_record_cannot_be_moved_to_another_seq_or_worker(tmp_path: Path) -> None:
    tenant_key = X25519PrivateKey.generate()
    async with sealed_stack(tmp_path, tenant_key) as stack:
        await _ask(stack, SSN_PROMPT, "rq1")
        wire = base64.b64decode(str(read_entries(tmp_path / "audit")[0].metadata["sealed_record"]))
        # The same record again under seq 2 (the gateway rewrites the clear seq): its AAD no longer matches.
        moved = wire[:1] + (2).to_bytes(8, "big") + wire[9:]
        stack.service.settlement.sealed_record(stack.worker, moved)
    code, out = _decisions_cli(tmp_path / "audit", _write_key(tenant_key, tmp_path / "tenant.pem"))
    assert code == 1 and "INVALID" in out


async def test_without_a_decision_record_key_sealed_decisions_reach_no_one(tmp_path: Path) -> None:
    async with sealed_stack(tmp_path, None) as stack:
        assert await _ask(stack, SSN_PROMPT, "rq1") == 403
        call = stack.stub.SealedGenerate(stack.sealed(SSN_PROMPT, "rq2")[1])
        [_ async for _ in call]
        assert list(await call.trailing_metadata()) == []
        assert len(stack.state.outbox) == 0
    assert read_entries(tmp_path / "audit") == []  # never in clear


def test_plaintext_decisions_must_name_that_request(tmp_path: Path) -> None:
    worker = Ed25519PrivateKey.generate()

    def record(request_id: str) -> worker_pb2.UsageRecord:
        payload, sig = sign_decision(worker, request_id=request_id, tenant="acme", key_id="k", model="m",
                                     version="v1", action="content-input", decision="deny", rule="r",
                                     policy_id="p", policy_version=1, at=1.0)
        return worker_pb2.UsageRecord(payload=payload, signature=sig, public_key=public_key_bytes(worker))

    records = [record("rq1-0"), record("rq1-x"), record("rq10-0"), record("rq2-0")]
    with AuditLog(tmp_path / "g.audit.jsonl", Ed25519PrivateKey.generate(), "gateway") as audit:
        appended = audit_worker_decisions(audit, records, pinned_key_hex=public_key_bytes(worker).hex(),
                                          request_id="rq1-0", tenant="acme", worker_id="w")
    assert appended == 1  # only the very request's
    actions = [r.action for r in read_entries(tmp_path / "g.audit.jsonl")]
    assert actions == ["worker-decision"] + ["worker-decision-invalid"] * 3
