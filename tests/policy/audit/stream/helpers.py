"""Shared pieces of the audit-forwarding tests: logs with entries, and checks on what a SIEM got."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from policy.audit import AuditLog
from policy.audit.entry import GENESIS, AuditEntry, check_signature, entry_hash, parse_entry

KEY = Ed25519PrivateKey.generate()
CANARY = "CANARY-7f3a-do-not-forward"


def write_entries(audit_dir: Path, component: str, count: int, start: int = 0) -> None:
    with AuditLog(audit_dir / f"{component}.audit.jsonl", KEY, component) as log:
        for i in range(start, start + count):
            # A careless caller quoting a prompt: the log keeps a digest, never the text.
            reason = f"refused: prompt was {CANARY}{'x' * 80}" if i % 3 == 0 else ""
            log.append(tenant="acme", action="key.release", decision="allow" if i % 2 else "deny",
                       reason=reason, metadata={"model": "m1", "n": i, "note": "-----BEGIN " + CANARY})


def check_received(raw_entries: list[str], expected: int,
                   key: Ed25519PublicKey | None = None) -> list[AuditEntry]:
    """What a SIEM received from one log, in arrival order, as signed entries (OCSF raw_data): every
    entry at least once, in order (a redelivery repeats a run, same ids), and the chain verifies
    (hashes, signatures with the component's key, links from the genesis). Returns the entries."""
    key = key or KEY.public_key()
    firsts: dict[str, Any] = {}
    order: list[int] = []
    for raw in raw_entries:
        entry, body = parse_entry(raw)
        assert entry_hash(body).hex() == entry.hash, f"entry {entry.seq}: hash does not match its body"
        assert check_signature(entry, bytes.fromhex(entry.hash), key), f"entry {entry.seq}: bad signature"
        if entry.hash in firsts:
            assert firsts[entry.hash].seq == entry.seq  # a duplicate carries the same event id
            continue
        firsts[entry.hash] = entry
        order.append(entry.seq)
    missing = sorted(set(range(expected)) - set(order))
    assert order == list(range(expected)), (f"{len(order)} distinct of {expected}; missing seqs {missing[:10]}; "
                                            f"first arrivals out of order: {order != sorted(order)}")
    prev = GENESIS
    entries = sorted(firsts.values(), key=lambda e: e.seq)
    for entry in entries:
        assert entry.prev == prev, f"entry {entry.seq} does not chain to entry {entry.seq - 1}"
        prev = entry.hash
    return entries


def no_canary(blob: bytes | str | list[Any]) -> None:
    text = blob if isinstance(blob, str | bytes) else json.dumps(blob)
    needle: str | bytes = CANARY.encode() if isinstance(text, bytes) else CANARY
    assert needle not in text  # type: ignore[operator]
