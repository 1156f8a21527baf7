"""The console's incremental audit index agrees with policy.audit.verify_log on where a log breaks
(one changed byte anywhere, a cut tail, checkpoints lost against an anchor), and picks up appends."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from api.console.auditindex import AuditIndex, load_component_keys
from policy.audit import AuditLog, WitnessFile, read_checkpoints, verify_log
from policy.errors import AuditIntegrityError

ENTRIES = 300


def _write(directory: Path, entries: int = ENTRIES, key: Ed25519PrivateKey | None = None) -> Path:
    key = key or Ed25519PrivateKey.generate()
    (directory / "keys").mkdir(parents=True, exist_ok=True)
    (directory / "keys" / "key-broker.pem").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    with AuditLog(directory / "key-broker.audit.jsonl", key, "key-broker", checkpoint_every=50) as log:
        for i in range(entries):
            log.append(tenant=f"t{i % 3}", action="release", decision="deny" if i % 4 == 0 else "allow",
                       reason="r", metadata={"rule": f"rule{i % 5}", "n": i})
    return directory / "key-broker.audit.jsonl"


def _expected(path: Path, anchored: list = ()) -> int | None:  # type: ignore[assignment]
    try:
        verify_log(path, load_component_keys(path.parent / "keys"), anchored)
    except AuditIntegrityError as exc:
        return exc.index
    return None


def _break(index: AuditIndex) -> int | None:
    index.refresh()
    broken = index.statuses()[0].broken
    return broken.index if broken else None


def test_intact_log_indexes_every_entry(tmp_path: Path) -> None:
    _write(tmp_path)
    index = AuditIndex(tmp_path, tmp_path / "keys")
    index.refresh()
    (status,) = index.statuses()
    assert status.broken is None and status.entries == status.verified == ENTRIES
    assert status.last_checkpoint is not None and status.last_checkpoint.tree_size == ENTRIES
    assert len(index.rows) == ENTRIES and sum(len(v) for v in index.by_tenant.values()) == ENTRIES


def test_any_single_changed_byte_breaks_at_the_same_entry_as_verify_log(tmp_path: Path) -> None:
    path = _write(tmp_path)
    original = path.read_bytes()
    lines = original.split(b"\n")
    index = AuditIndex(tmp_path, tmp_path / "keys")
    assert _break(index) is None
    rng = random.Random(16)
    for _ in range(40):
        target = rng.randrange(ENTRIES)
        line = bytearray(lines[target])
        at = rng.randrange(len(line))
        line[at] = line[at] ^ 0x01 if line[at] ^ 0x01 != 0x0A else line[at] ^ 0x02  # never a newline
        path.write_bytes(b"\n".join([*lines[:target], bytes(line), *lines[target + 1:]]))
        expected = _expected(path)
        assert expected == target, (target, at)
        assert _break(index) == expected, (target, at, chr(lines[target][at]))
    path.write_bytes(original)
    assert _break(index) is None


def test_cut_tail_is_caught_by_the_checkpoints(tmp_path: Path) -> None:
    path = _write(tmp_path)
    index = AuditIndex(tmp_path, tmp_path / "keys")
    assert _break(index) is None
    lines = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join(lines[:200]) + b"\n")
    assert _break(index) == _expected(path) == 200
    assert "truncated" in index.statuses()[0].broken.reason


def test_log_and_checkpoints_cut_together_are_caught_by_the_anchor(tmp_path: Path) -> None:
    path = _write(tmp_path)
    witness = WitnessFile(tmp_path.parent / f"{tmp_path.name}-witness.jsonl")
    for ck in read_checkpoints(path):
        witness.publish(ck)
    index = AuditIndex(tmp_path, tmp_path / "keys", [witness])
    assert _break(index) is None
    assert index.statuses()[0].last_anchored.tree_size == ENTRIES
    # Whoever holds the directory cuts the log and its checkpoint file back consistently.
    lines = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join(lines[:150]) + b"\n")
    ckpt = Path(str(path) + ".ckpt")
    ckpt.write_text("".join(c.to_json() + "\n" for c in read_checkpoints(path) if c.tree_size <= 150))
    unanchored = AuditIndex(tmp_path, tmp_path / "keys")
    assert _break(unanchored) is None  # undetectable without the anchor, as documented
    assert _break(index) == _expected(path, witness.read()) is not None


def test_appends_are_indexed_and_an_edit_after_them_still_shows(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    path = _write(tmp_path, 100, key)
    index = AuditIndex(tmp_path, tmp_path / "keys")
    assert _break(index) is None and len(index.rows) == 100
    with AuditLog(path, key, "key-broker", checkpoint_every=50) as log:
        for i in range(25):
            log.append(tenant="t9", action="admit", decision="allow", reason="r", metadata={"rule": "late", "n": i})
    assert _break(index) is None and len(index.rows) == 125 and len(index.by_rule["late"]) == 25
    data = bytearray(path.read_bytes())
    at = data.index(b'"n":42')
    data[at + 5] = ord("3")
    path.write_bytes(bytes(data))
    assert _break(index) == _expected(path) == 42


@pytest.mark.parametrize("junk", [b"not json\n", b'{"v":1}\n'])
def test_malformed_line_breaks_there(tmp_path: Path, junk: bytes) -> None:
    path = _write(tmp_path, 60)
    lines = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join(lines[:30]) + b"\n" + junk + b"\n".join(lines[31:]))
    index = AuditIndex(tmp_path, tmp_path / "keys")
    assert _break(index) == _expected(path) == 30
