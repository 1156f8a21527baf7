"""Audit log: chain and signatures, one tamper test per mutation class, checkpoints, queries."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from policy import AuditIntegrityError
from policy.audit import (
    AuditLog,
    auditor_entries,
    export_jsonl,
    latest_checkpoint,
    prove_inclusion,
    read_entries,
    verify_dir,
    verify_log,
)
from policy.audit.entry import entry_hash, parse_entry
from policy.audit.merkle import CompactRange, inclusion_proof, merkle_root, verify_inclusion

KEY = Ed25519PrivateKey.generate()
KEYS: dict[str, Ed25519PublicKey] = {"gateway": KEY.public_key()}


def _write(path: Path, n: int = 6, **kw: object) -> list[str]:
    with AuditLog(path, KEY, "gateway", **kw) as log:  # type: ignore[arg-type]
        for i in range(n):
            log.append(tenant="acme" if i % 2 else "globex", action="admission",
                       decision="allow" if i % 3 else "deny", reason=f"r{i}", metadata={"n": i})
    return path.read_text().splitlines(keepends=True)


def _rewrite(path: Path, lines: list[str], keep_ckpt: bool = False) -> None:
    path.write_text("".join(lines))
    if not keep_ckpt:
        (path.parent / (path.name + ".ckpt")).unlink(missing_ok=True)


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "gateway.audit.jsonl"


def test_clean_log_verifies(log_path: Path) -> None:
    _write(log_path, 6)
    report = verify_log(log_path, KEYS)
    assert report.entries == 6 and report.component == "gateway" and report.checkpoints == 1
    assert not report.torn_tail


def test_reopen_continues_chain(log_path: Path) -> None:
    _write(log_path, 3)
    _write(log_path, 3)
    assert verify_log(log_path, KEYS).entries == 6
    assert [e.seq for e in read_entries(log_path)] == list(range(6))


def _edit(lines: list[str]) -> list[str]:
    raw = json.loads(lines[2])
    raw["decision"] = "allow" if raw["decision"] == "deny" else "deny"
    return [*lines[:2], json.dumps(raw) + "\n", *lines[3:]]


def _forge(lines: list[str]) -> list[str]:
    # Re-sign a rewritten entry (and re-chain the rest) with a key that is not the component's.
    wrong = Ed25519PrivateKey.generate()
    out, prev = list(lines[:2]), json.loads(lines[1])["hash"]
    for line in lines[2:]:
        raw = json.loads(line)
        raw["prev"] = prev
        if raw["seq"] == 2:
            raw["reason"] = "forged"
        body = {k: v for k, v in raw.items() if k not in ("hash", "sig")}
        digest = entry_hash(body)
        raw["hash"], raw["sig"] = digest.hex(), wrong.sign(digest).hex()
        prev = raw["hash"]
        out.append(json.dumps(raw) + "\n")
    return out


@pytest.mark.parametrize(
    ("mutation", "first_bad"),
    [
        ("edit", 2),
        ("delete", 2),
        ("insert", 2),
        ("reorder", 2),
        ("truncate_middle", 2),
        ("resign_wrong_key", 2),
        ("delete_first", 0),
    ],
)
def test_tamper_is_detected(log_path: Path, mutation: str, first_bad: int) -> None:
    lines = _write(log_path, 6)
    mutated = {
        "edit": lambda: _edit(lines),
        "delete": lambda: lines[:2] + lines[3:],
        "insert": lambda: [*lines[:2], lines[4], *lines[2:]],
        "reorder": lambda: [*lines[:2], lines[3], lines[2], *lines[4:]],
        # Cut bytes from the middle of the file: part of entry 2 and all of entry 3 disappear.
        "truncate_middle": lambda: [*lines[:2], lines[2][:40] + lines[4], lines[5]],
        "resign_wrong_key": lambda: _forge(lines),
        "delete_first": lambda: lines[1:],
    }[mutation]()
    _rewrite(log_path, mutated)
    with pytest.raises(AuditIntegrityError) as exc:
        verify_log(log_path, KEYS)
    assert exc.value.index == first_bad, exc.value.reason


def test_truncated_tail_caught_by_checkpoint(log_path: Path) -> None:
    lines = _write(log_path, 6)
    _rewrite(log_path, lines[:4], keep_ckpt=True)
    with pytest.raises(AuditIntegrityError, match="truncated") as exc:
        verify_log(log_path, KEYS)
    assert exc.value.index == 4


def test_rewrite_with_real_key_caught_by_checkpoint(log_path: Path) -> None:
    lines = _write(log_path, 4)
    # An insider holding the real key rewrites history; the published checkpoint still disagrees.
    out, prev = [], "0" * 64
    for line in lines:
        raw = json.loads(line)
        raw["prev"], raw["reason"] = prev, "rewritten"
        body = {k: v for k, v in raw.items() if k not in ("hash", "sig")}
        digest = entry_hash(body)
        raw["hash"], raw["sig"] = digest.hex(), KEY.sign(digest).hex()
        prev = raw["hash"]
        out.append(json.dumps(raw) + "\n")
    _rewrite(log_path, out, keep_ckpt=True)
    with pytest.raises(AuditIntegrityError, match="checkpoint"):
        verify_log(log_path, KEYS)


def test_unknown_component_key(log_path: Path) -> None:
    _write(log_path, 1)
    with pytest.raises(AuditIntegrityError, match="no public key"):
        verify_log(log_path, {"worker": KEY.public_key()})


def test_torn_tail_is_tolerated_and_dropped_on_reopen(log_path: Path) -> None:
    lines = _write(log_path, 3)
    log_path.write_text("".join(lines) + lines[0][:30])
    assert verify_log(log_path, KEYS).torn_tail
    _write(log_path, 1)
    report = verify_log(log_path, KEYS)
    assert report.entries == 4 and not report.torn_tail


def test_second_writer_refused(log_path: Path) -> None:
    with AuditLog(log_path, KEY, "gateway"), pytest.raises(BlockingIOError):
        AuditLog(log_path, KEY, "gateway")


@pytest.mark.parametrize(
    "meta",
    [{"prompt": "hi"}, {"completion_text": "x"}, {"messages": "x"}, {"data_key": "00"},
     {"user_content": "x"}, {"Bad Key": 1}],
)
def test_content_like_metadata_keys_refused(log_path: Path, meta: dict[str, object]) -> None:
    with AuditLog(log_path, KEY, "gateway") as log, pytest.raises(ValueError):
        log.append(tenant="t", action="a", decision="allow", metadata=meta)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "value", ["y" * 300, "-----BEGIN PRIVATE KEY-----", {"a": "nested-secret"}, float("inf"), ["listed-secret"]],
)
def test_unloggable_metadata_values_are_withheld_not_refused(log_path: Path, value: object) -> None:
    # Values are often attacker-controlled: the append must succeed, holding a digest, not the value.
    with AuditLog(log_path, KEY, "gateway") as log:
        entry = log.append(tenant="t" * 500, action="a", decision="deny", reason="r -----BEGIN x" + "z" * 900,
                           metadata={"note": value})  # type: ignore[dict-item]
    assert str(entry.metadata["note"]).startswith("~withheld:sha256=")
    assert entry.tenant.startswith("~withheld:") and len(entry.reason) <= 512
    raw = log_path.read_text()
    for needle in ("y" * 257, "-----BEGIN", "nested-secret", "listed-secret", "t" * 129):
        assert needle not in raw
    assert verify_log(log_path, KEYS).entries == 1


def test_concurrent_appends_keep_one_chain(log_path: Path) -> None:
    with AuditLog(log_path, KEY, "gateway", fsync="group") as log:
        threads = [threading.Thread(target=lambda: [log.append(tenant="t", action="a", decision="allow")
                                                    for _ in range(50)]) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert verify_log(log_path, KEYS).entries == 200


def test_periodic_checkpoints_and_inclusion(log_path: Path) -> None:
    _write(log_path, 25, checkpoint_every=10, batch_max=5)
    ck = latest_checkpoint(log_path)
    assert ck is not None and ck.tree_size == 25
    leaves = [bytes.fromhex(parse_entry(line)[0].hash) for line in log_path.read_text().splitlines()]
    assert ck.root == merkle_root(leaves).hex()
    proof = inclusion_proof(leaves, 7)
    assert verify_inclusion(leaves[7], 7, 25, proof, bytes.fromhex(ck.root))
    assert prove_inclusion(log_path, 7, 25) == [p.hex() for p in proof]
    with pytest.raises(AuditIntegrityError):
        prove_inclusion(log_path, 7, 26)
    assert not verify_inclusion(leaves[8], 7, 25, proof, bytes.fromhex(ck.root))


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 8, 13, 64, 100])
def test_compact_range_matches_reference(n: int) -> None:
    leaves = [bytes([i % 256]) * 32 for i in range(n)]
    cr = CompactRange()
    for leaf in leaves:
        cr.push(leaf)
    assert cr.root() == merkle_root(leaves)
    for i in range(n):
        assert verify_inclusion(leaves[i], i, n, inclusion_proof(leaves, i), cr.root())


def test_directory_queries_and_auditor_isolation(tmp_path: Path) -> None:
    keys = {c: KEY.public_key() for c in ("gateway", "worker", "key_broker")}
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    for offset, comp in enumerate(keys):
        clock = iter(t0 + timedelta(minutes=offset + 3 * i) for i in range(100))
        with AuditLog(tmp_path / f"{comp}.audit.jsonl", KEY, comp, clock=lambda c=clock: next(c)) as log:
            for i in range(4):
                log.append(tenant=("acme", "globex")[i % 2], action=comp, decision=("allow", "deny")[i // 2])
    assert len(verify_dir(tmp_path, keys)) == 3
    all_rows = read_entries(tmp_path)
    assert len(all_rows) == 12 and [e.ts for e in all_rows] == sorted(e.ts for e in all_rows)
    mine = auditor_entries(tmp_path, "acme")
    assert len(mine) == 6 and {e.tenant for e in mine} == {"acme"}
    assert auditor_entries(tmp_path, "nobody") == []
    since = t0 + timedelta(minutes=4)
    rows = read_entries(tmp_path, since=since, component="worker", decision="deny")
    assert rows and all(e.ts >= since and e.component == "worker" and e.decision == "deny" for e in rows)
    exported = export_jsonl(tmp_path, tenant="globex", decision="allow")
    assert all(json.loads(x)["tenant"] == "globex" for x in exported.splitlines())
    assert len(exported.splitlines()) == 3


def test_auditor_cannot_see_other_tenants(tmp_path: Path) -> None:
    with AuditLog(tmp_path / "gateway.audit.jsonl", KEY, "gateway") as log:
        for tenant in ("acme", "acme2", "ACME", "acme ", "globex", ""):
            log.append(tenant=tenant, action="admission", decision="allow")
    assert [e.tenant for e in auditor_entries(tmp_path, "acme")] == ["acme"]
    assert all(e.tenant == "globex" for e in auditor_entries(tmp_path, "globex", decision="allow"))
    with pytest.raises(ValueError):
        auditor_entries(tmp_path, "")  # no "all tenants" escape hatch
    assert {json.loads(x)["tenant"] for x in export_jsonl(tmp_path, tenant="acme2").splitlines()} == {"acme2"}
