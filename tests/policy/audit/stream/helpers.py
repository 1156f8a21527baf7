"""Shared pieces of the audit-forwarding tests: logs with entries, and checks on what a SIEM got."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from policy.audit import AuditLog
from policy.audit.entry import GENESIS, check_signature, entry_hash, parse_entry

KEY = Ed25519PrivateKey.generate()
CANARY = "CANARY-7f3a-do-not-forward"


def write_entries(audit_dir: Path, component: str, count: int, start: int = 0) -> None:
    with AuditLog(audit_dir / f"{component}.audit.jsonl", KEY, component) as log:
        for i in range(start, start + count):
            # A careless caller quoting a prompt: the log keeps a digest, never the text.
            reason = f"refused: prompt was {CANARY}{'x' * 80}" if i % 3 == 0 else ""
            log.append(tenant="acme", action="key.release", decision="allow" if i % 2 else "deny",
                       reason=reason, metadata={"model": "m1", "n": i, "note": "-----BEGIN " + CANARY})


def check_received(raw_entries: list[str], expected: int) -> None:
    """What a SIEM received, in arrival order, as signed entries (OCSF raw_data): every entry at
    least once, in order (a redelivery repeats a run, same ids), and the chain verifies."""
    firsts: dict[str, Any] = {}
    order: list[int] = []
    for raw in raw_entries:
        entry, body = parse_entry(raw)
        assert entry_hash(body).hex() == entry.hash
        assert check_signature(entry, bytes.fromhex(entry.hash), KEY.public_key())
        if entry.hash in firsts:
            assert firsts[entry.hash].seq == entry.seq  # a duplicate carries the same event id
            continue
        firsts[entry.hash] = entry
        order.append(entry.seq)
    assert order == list(range(expected))
    prev = GENESIS
    for entry in sorted(firsts.values(), key=lambda e: e.seq):
        assert entry.prev == prev
        prev = entry.hash


def no_canary(blob: bytes | str | list[Any]) -> None:
    text = blob if isinstance(blob, str | bytes) else json.dumps(blob)
    needle: str | bytes = CANARY.encode() if isinstance(text, bytes) else CANARY
    assert needle not in text  # type: ignore[operator]
