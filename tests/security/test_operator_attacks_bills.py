"""The operator attacks the tenant's bill (issue #46, attack 5b).

On main at c92c9f1 a usage row inserted into the control-plane database with a signature of 64 zero
bytes raised the tenant's reported prompt tokens in `sealed usage` by its count: the gateway checked
a record's signature when it wrote the row, and nothing read it back. Now each row keeps the signed
record and its usage key; the ledger is checked again when it is read (a failing row is flagged and
never counted), and the tenant checks its whole export on its own machine against its own client
policy (`sealed usage --export` / `--verify`): hardware evidence must bind each usage key.
The real gateway app and a real worker servicer (caller_harness.py), the real CLI.
"""

from __future__ import annotations

import base64
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from typer.testing import CliRunner

from api.cli.main import build
from policy.audit.worker_record import public_key_bytes
from tests.security.caller_harness import TENANT, client_policy, deployment, sim_document

FORGED = 900_000


def _cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(build(), ["usage", *args])
    return result.exit_code, result.stdout, result.stderr


def _prompt_total(home: Path) -> int:
    code, out, _ = _cli("--home", str(home), "--tenant", TENANT, "--json")
    assert code == 0, out
    return sum(r["prompt_tokens"] for r in json.loads(out))


def _db(home: Path) -> sqlite3.Connection:
    return sqlite3.connect(home / "gateway" / "control-plane.db")


def _insert(home: Path, request_id: str, signature: str, payload: str | None = None,
            public_key: str | None = None, prompt_tokens: int = FORGED) -> None:
    with _db(home) as db:
        db.execute("INSERT INTO usage (request_id, tenant, key_id, model, version, worker_id, prompt_tokens, "
                   "completion_tokens, worker_seconds, signature, payload, public_key, created_at) VALUES "
                   "(?, 'acme', 'key_0000', 'm', 'v1', 'w-forged', ?, 0, 0.0, ?, ?, ?, '2026-12-06 00:00:00')",
                   (request_id, prompt_tokens, signature, payload, public_key))


async def _served(home: Path) -> Any:
    """One real request, metered: its row is the genuine one."""
    async with deployment(home) as d:
        answer = await d.plaintext(d.tenant_key)
        assert answer.status_code == 200, answer.text
        return d.state


async def test_a_forged_usage_row_is_flagged_and_never_counted(tmp_path: Path) -> None:
    await _served(tmp_path)
    before = _prompt_total(tmp_path)
    assert before > 0
    _insert(tmp_path, "forged-1", "00" * 64)  # the attack as seen on main
    assert _prompt_total(tmp_path) == before
    code, out, _ = _cli("--home", str(tmp_path), "--tenant", TENANT)
    assert code == 0 and "FLAGGED usage row" in out and "carries no signed record" in out, out
    # The tenant exports its ledger and checks it on its own machine: the forged row is reported.
    ledger, policy = tmp_path / "ledger.json", tmp_path / "client-policy.json"
    policy.write_text(json.dumps(client_policy()))
    assert _cli("--home", str(tmp_path), "--tenant", TENANT, "--export", str(ledger))[0] == 0
    code, out, _ = _cli("--verify", str(ledger), "--policy", str(policy), "--unsafe-allow-simulated")
    assert code == 1, out
    assert "FLAGGED record" in out and "forged-1" in out and "1 usage keys verified" in out
    code, out, _ = _cli("--verify", str(ledger), "--policy", str(policy), "--unsafe-allow-simulated", "--json")
    check = json.loads(out)
    assert sum(t["prompt_tokens"] for t in check["totals"].values()) == before
    assert [f["request_id"] for f in check["flagged"]] == ["forged-1"]


async def test_the_ledger_read_back_refuses_every_row_that_is_not_what_a_registered_key_signed(
        tmp_path: Path) -> None:
    state = await _served(tmp_path)
    before = _prompt_total(tmp_path)
    with _db(tmp_path) as db:
        payload, signature, key = db.execute("SELECT payload, signature, public_key FROM usage").fetchone()
    doc = json.loads(base64.b64decode(payload))
    own = Ed25519PrivateKey.generate()  # the operator's own key: signs well, but no attested worker's
    forged = json.dumps({**doc, "request_id": "r-own", "prompt_tokens": FORGED}, sort_keys=True,
                        separators=(",", ":")).encode()
    cases = {  # request id -> (signature, payload, key, stored prompt tokens), and the reason read back
        "r-zero": (("00" * 64, payload, key, FORGED), "does not verify"),
        "r-missing-sig": (("", payload, key, FORGED), "no Ed25519 signature"),
        "r-no-payload": ((signature, None, key, FORGED), "carries no signed record"),
        "r-own": ((own.sign(forged).hex(), base64.b64encode(forged).decode(), public_key_bytes(own).hex(), FORGED),
                  "no attested worker registered"),
        # a copy of the genuine record with its count edited in the row
        doc["request_id"]: ((signature, payload, key, FORGED), "differs from its signed record (prompt_tokens"),
    }
    with _db(tmp_path) as db:
        db.execute("DROP INDEX ux_usage_worker_request")  # the edited copy stands beside the original
    for rid, ((sig, pay, pub, prompt), _) in cases.items():
        _insert(tmp_path, rid, sig, pay, pub, prompt)
    with _db(tmp_path) as db:  # the edited copy names the genuine worker and request
        db.execute("UPDATE usage SET worker_id = (SELECT worker_id FROM usage ORDER BY id LIMIT 1), key_id = ? "
                   "WHERE request_id = ? AND prompt_tokens = ?", (doc["key_id"], doc["request_id"], FORGED))
    assert _prompt_total(tmp_path) == before
    _, _, err = _cli("--home", str(tmp_path), "--tenant", TENANT, "--json")
    reasons = dict(line.split(": ", 1) for line in err.splitlines() if line.startswith("flagged"))
    assert len(reasons) == len(cases)
    for rid, (_, reason) in cases.items():
        assert any(reason in r for r in reasons.values()), (rid, reason, reasons)
    assert state is not None


def _export(tmp_path: Path) -> dict[str, Any]:
    code, out, _ = _cli("--home", str(tmp_path), "--tenant", TENANT, "--export", str(tmp_path / "l.json"))
    assert code == 0, out
    return json.loads((tmp_path / "l.json").read_text())  # type: ignore[no-any-return]


def _verify(tmp_path: Path, ledger: dict[str, Any]) -> dict[str, Any]:
    (tmp_path / "edited.json").write_text(json.dumps(ledger))
    (tmp_path / "policy.json").write_text(json.dumps(client_policy()))
    code, out, _ = _cli("--verify", str(tmp_path / "edited.json"), "--policy", str(tmp_path / "policy.json"),
                        "--unsafe-allow-simulated", "--json")
    assert code in (0, 1), out
    return {**json.loads(out), "exit": code}


@pytest.mark.parametrize("edit, expect", [
    ("none", None),
    ("key-evidence-binds-another-key", "does not bind this usage key"),
    ("key-evidence-of-another-tenant", "of tenant 'globex'"),
    ("key-without-evidence", "no attestation evidence"),
    ("stored-count-edited", "differs from the signed record (prompt_tokens)"),
    ("record-duplicated", "counted once"),
    ("signature-missing", "no Ed25519 signature"),
    ("payload-edited", "does not verify"),
])
async def test_the_tenant_verifies_its_export_and_trusts_none_of_it(tmp_path: Path, edit: str,
                                                                    expect: str | None) -> None:
    state = await _served(tmp_path)
    ledger = _export(tmp_path)
    (record,) = ledger["records"]
    (key,) = ledger["usage_keys"]
    honest = record["stored"]["prompt_tokens"]
    if edit == "key-evidence-binds-another-key":
        ledger["usage_keys"][key] = sim_document(state, usage_public=public_key_bytes(Ed25519PrivateKey.generate()))
    elif edit == "key-evidence-of-another-tenant":
        ledger["usage_keys"][key] = sim_document(state, tenant="globex")
    elif edit == "key-without-evidence":
        ledger["usage_keys"][key] = {"tee": "sim"}
    elif edit == "stored-count-edited":
        record["stored"]["prompt_tokens"] = FORGED
    elif edit == "record-duplicated":
        ledger["records"].append(dict(record))
    elif edit == "signature-missing":
        record["signature"] = ""
    elif edit == "payload-edited":
        doc = json.loads(base64.b64decode(record["payload"]))
        record["payload"] = base64.b64encode(json.dumps({**doc, "prompt_tokens": FORGED}).encode()).decode()
    check = _verify(tmp_path, ledger)
    reasons = [f["reason"] for f in check["flagged"]] + list(check["keys_refused"].values())
    counted = sum(t["prompt_tokens"] for t in check["totals"].values())
    if expect is None:
        assert check["exit"] == 0 and not reasons and counted == honest
        return
    assert check["exit"] == 1 and any(expect in r for r in reasons), reasons
    # Never more than the worker signed; an edited row counts as signed, an unbound key not at all.
    assert counted in (0, honest)


async def test_the_management_api_serves_each_tenant_only_its_own_ledger(tmp_path: Path) -> None:
    from api.management.auth import issue_token
    from tests.security.caller_harness import JWT_SECRET

    async with deployment(tmp_path) as d:
        assert (await d.plaintext(d.tenant_key)).status_code == 200
        _insert(tmp_path, "forged-2", "00" * 64)

        def auth(tenant: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {issue_token(JWT_SECRET, 'x', 'tenant-admin', tenant)}"}

        own = (await d.client.get("/admin/v1/usage/ledger?tenant=globex", headers=auth(TENANT))).json()
        assert own["tenant"] == TENANT and len(own["records"]) == 2 and len(own["usage_keys"]) == 1
        other = (await d.client.get("/admin/v1/usage/ledger?tenant=acme", headers=auth("globex"))).json()
        assert other["tenant"] == "globex" and other["records"] == [] and other["usage_keys"] == {}
        usage = (await d.client.get("/admin/v1/usage", headers=auth(TENANT))).json()
        assert [f["request_id"] for f in usage["flagged"]] == ["forged-2"]
        assert sum(r["prompt_tokens"] for r in usage["data"]) < FORGED
